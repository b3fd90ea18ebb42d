"""A base for SDK objects that hold something open: `with Thing(...) as thing:` closes it."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    """`close()` releases what the object holds; leaving a `with` block calls it."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
