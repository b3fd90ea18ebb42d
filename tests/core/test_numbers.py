"""parse_whole: typed whole numbers in a range, refused with what was wrong."""

from __future__ import annotations

import pytest

from gpulease.core.errors import InvalidInput
from gpulease.core.numbers import parse_whole


@pytest.mark.parametrize(("text", "value"), [("1", 1), (" 64 ", 64), ("1_000", 1000), (7, 7)])
def test_whole_numbers_in_range(text: str | int, value: int) -> None:
    assert parse_whole(text, "the count", 1, 1000) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("two", "the count must be a whole number, not 'two'; try 2"),
        ("1.5", "the count must be a whole number, not '1.5'; try 2"),
        ("0", "the count must be from 1 to 1,000, not 0; try 2"),
        ("1001", "the count must be from 1 to 1,000, not 1,001; try 2"),
    ],
)
def test_anything_else_is_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_whole(text, "the count", 1, 1000, hint="; try 2")
    assert refused.value.message == message
