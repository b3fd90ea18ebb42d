"""Whole numbers people type into forms (a GPU count, a number of uses): one parser, one
wording for the refusal."""

from __future__ import annotations

from gpulease.core.errors import InvalidInput


def parse_whole(text: str | int, what: str, low: int, high: int, *, hint: str = "") -> int:
    """text as a whole number from low to high (digits may be grouped with '_', as in
    Python); InvalidInput naming `what`, then `hint`, otherwise."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise InvalidInput(f"{what} must be a whole number, not {text!r}{hint}") from None
    if not low <= value <= high:
        raise InvalidInput(f"{what} must be from {low:,} to {high:,}, not {value:,}{hint}")
    return value
