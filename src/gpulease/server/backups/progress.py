"""How backups report progress: the CLI draws Rich bars, tests pass no_progress."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

Advance = Callable[[int], None]
"""advance(amount): that many more bytes (or rows) are done."""


class Step(Protocol):
    def __call__(self, description: str, total: int | None, unit: str = "bytes") -> Advance:
        """Start a progress line (total None: unknown) counting `unit` ("bytes" or "rows")."""
        ...


def no_progress(description: str, total: int | None, unit: str = "bytes") -> Advance:
    return lambda amount: None
