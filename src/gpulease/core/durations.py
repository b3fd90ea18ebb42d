"""Lengths of time for people: the one formatter the console and the CLI share."""

from __future__ import annotations


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
