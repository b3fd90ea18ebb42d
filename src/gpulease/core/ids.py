"""Row ids as people and URLs write them: ASCII digits, within a signed 64-bit integer."""

from __future__ import annotations

MAX_ID = 2**63 - 1  # the largest id a BIGINT (and SQLite's INTEGER) can hold


def parse_id(text: str) -> int | None:
    """'42' -> 42; None for anything that is not an id: no sign, no spaces, no non-ASCII
    digits ('²', '٣'), nothing above MAX_ID (a database would overflow rather than say
    'not found')."""
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if 0 < value <= MAX_ID else None
