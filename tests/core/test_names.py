"""NameRule: the one shape of names people give things, and the refusal that states it."""

from __future__ import annotations

import pytest

from gpulease.core.errors import InvalidInput
from gpulease.core.names import NameRule

TEAM = NameRule("team name", 2, 64)
BOX = NameRule("box name", 1, 8, "-", why="it becomes a host name")


@pytest.mark.parametrize("name", ["ab", "a.b_c-d", "z" * 64, "a1"])
def test_names_within_the_rule_come_back_unchanged(name: str) -> None:
    assert TEAM.check(name) == name


@pytest.mark.parametrize("name", ["a", "z" * 65, "1abc", "Abc", "a b", "a/b", "ab\n", ""])
def test_names_outside_the_rule_are_refused_with_the_rule(name: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        TEAM.check(name)
    assert refused.value.message == (
        f"{name!r} is not a valid team name: use 2-64 lowercase letters, digits, '.', '_' and "
        "'-', starting with a letter"
    )


def test_each_kind_states_its_own_marks_and_why() -> None:
    assert BOX.check("a-1") == "a-1"
    with pytest.raises(
        InvalidInput,
        match=r"use 1-8 lowercase letters, digits and '-', "
        r"starting with a letter \(it becomes a host name\)",
    ):
        BOX.check("a.b")


def test_a_range_that_cannot_hold_a_name_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        NameRule("nothing", 0, 3)
