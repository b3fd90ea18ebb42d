"""Lengths of time for people: the one formatter the console and the CLI share, and the
parser of what people write (`--max-duration 2h`)."""

from __future__ import annotations

import math
import re

from gpulease.core.errors import InvalidInput


def span(seconds: int) -> str:
    """'42 s', '5 min 3 s', '2 h 10 min', '3 d 4 h' (negative counts as 0)."""
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return f"{seconds} s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {sec} s" if sec else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|min|m)", re.IGNORECASE)
_MINUTES = {"d": 1440, "h": 60, "min": 1, "m": 1}


def parse_minutes(text: str, what: str = "max_duration") -> int:
    """'2h', '90m', '1h30m', '1.5 h', '2d' as whole minutes (rounded up); a refusal that
    says how to write it otherwise."""
    compact = str(text).strip()
    parts = _PART.findall(compact)
    if not compact or _PART.sub("", compact).strip() or not parts:
        raise InvalidInput(
            f"{what} {text!r} is not a length of time: write it with units, e.g. 2h, 90m or "
            "1h30m (d, h, m)"
        )
    minutes = math.ceil(sum(float(n) * _MINUTES[unit.lower()] for n, unit in parts))
    if minutes < 1:
        raise InvalidInput(f"{what} must be at least 1 minute, e.g. 30m")
    return minutes
