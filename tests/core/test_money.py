"""Money: parsing, formatting and per-second pricing in integer micro-credits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulease.core.money import MoneyError, cost_for_seconds, format_credits, ncu, parse_credits


def test_parse_and_format() -> None:
    assert parse_credits("12.5") == 12_500_000
    assert parse_credits("$0.25") == 250_000
    assert parse_credits(3) == 3_000_000
    assert format_credits(12_345_678) == "$12.3456"
    assert format_credits(-250_000, "¥", 2) == "-¥0.25"
    for bad in ("abc", "1.0000001", "nan", "inf", ""):
        with pytest.raises(MoneyError):
            parse_credits(bad)


def test_hourly_prices_per_second() -> None:
    assert cost_for_seconds(900_000, 3600) == 900_000
    assert cost_for_seconds(900_000, 1) == 250
    assert cost_for_seconds(250_000, 1) == 69  # 69.44 floored once
    assert cost_for_seconds(250_000, 3600 * 24) == 6_000_000
    with pytest.raises(MoneyError):
        cost_for_seconds(1, -1)


def test_ncu_is_one_a100_day() -> None:
    assert ncu(900_000 * 24, 900_000) == 1
    assert ncu(250_000 * 24, 900_000) < 1


@given(
    rate=st.integers(min_value=0, max_value=10**9),
    cuts=st.lists(st.integers(min_value=0, max_value=10**6), max_size=20),
)
def test_cumulative_billing_in_any_steps_equals_one_shot(rate: int, cuts: list[int]) -> None:
    """What the meter relies on: charging due(t) - charged at each tick sums to due(end)."""
    charged = 0
    for t in sorted(cuts):
        charged += cost_for_seconds(rate, t) - charged
    end = max(cuts, default=0)
    assert charged == cost_for_seconds(rate, end)


def test_an_unset_cap_reads_as_no_cap() -> None:
    from gpulease.core.money import format_cap

    assert format_cap(None, "$") == "no cap"
    assert format_cap(None, "", unset="") == ""
    assert format_cap(12_500_000, "$") == "$12.50"
    assert format_cap(12_500_000, "", 4, unset="-") == "12.5000"
