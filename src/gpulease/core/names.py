"""The one shape of a name people give things (users, teams, templates, datasets): lowercase
letters, digits and a few punctuation marks, starting with a letter, within a length range.
Each kind states its range and marks once, and the refusal says the rule."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpulease.core.errors import InvalidInput


@dataclass(frozen=True)
class NameRule:
    what: str
    """How the refusal calls the name: "user name"."""
    min_len: int
    max_len: int
    punctuation: str = "._-"
    """The marks allowed besides letters and digits, in the order the refusal lists them."""
    why: str = ""
    """Said after the rule, when the name ends up somewhere: "it becomes the directory …"."""
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"{self.what}: a length range of {self.min_len}-{self.max_len}")
        allowed = "a-z0-9" + "".join(re.escape(c) for c in self.punctuation)
        rest = f"{{{self.min_len - 1},{self.max_len - 1}}}"
        object.__setattr__(self, "pattern", re.compile(f"[a-z][{allowed}]{rest}"))

    def check(self, name: str) -> str:
        """name itself when it follows the rule; InvalidInput saying the rule when not."""
        if not self.pattern.fullmatch(name):
            raise InvalidInput(f"{name!r} is not a valid {self.what}: {self.rule}")
        return name

    @property
    def rule(self) -> str:
        marks = [f"'{c}'" for c in self.punctuation]
        chars = ", ".join(["digits", *marks[:-1]]) + (f" and {marks[-1]}" if marks else "")
        why = f" ({self.why})" if self.why else ""
        return (
            f"use {self.min_len}-{self.max_len} lowercase letters, {chars}, "
            f"starting with a letter{why}"
        )
