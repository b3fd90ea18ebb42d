"""Row ids as people and URLs write them: ASCII digits, within what an id column holds."""

from __future__ import annotations

# Ids are INTEGER columns: 32 bits on PostgreSQL (SQLite's hold 64). A larger id would
# overflow inside the driver rather than be simply not found, so it is refused first.
MAX_ID = 2**31 - 1
# Counts and sizes stored in BIGINT columns (bytes of a dataset, micro-credits).
MAX_BIGINT = 2**63 - 1


def parse_id(text: str) -> int | None:
    """'42' -> 42; None for anything that is not an id: no sign, no spaces, no non-ASCII
    digits ('²', '٣'), nothing above MAX_ID."""
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if 0 < value <= MAX_ID else None
