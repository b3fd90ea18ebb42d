"""Off-peak pricing: window parsing, overlap, and segment prices checked against brute force."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulease.core.errors import InvalidInput
from gpulease.core.pricing import (
    OffPeakWindow,
    check_no_overlap,
    format_discount,
    parse_clock,
    parse_discount_bp,
    parse_discount_pct,
    parse_weekdays,
    price_seconds,
)
from pricing_oracle import brute_force_price

NIGHT = OffPeakWindow(frozenset(range(7)), 0, 8 * 60, 4_000)  # 00:00-08:00 UTC, 40 % off


def test_crossing_a_window_edge_splits_the_segment() -> None:
    start = datetime(2026, 11, 30, 7, 59, 30, tzinfo=UTC)  # 30 s off-peak, then peak
    # 30 s at $0.54/h (0.9 - 40 %) + 90 s at $0.90/h
    assert (
        price_seconds(start, 120, 900_000, [NIGHT]) == 540_000 * 30 // 3600 + 900_000 * 90 // 3600
    )


def test_time_zone_moves_the_window() -> None:
    start = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)  # 09:00 in Shanghai: peak there
    shanghai_night = OffPeakWindow(NIGHT.weekdays, 0, 8 * 60, 4_000, tz="Asia/Shanghai")
    assert price_seconds(start, 3600, 900_000, [shanghai_night]) == 900_000
    assert price_seconds(start, 3600, 900_000, [NIGHT]) == 540_000


def test_windows_past_midnight_and_weekdays() -> None:
    late = OffPeakWindow(parse_weekdays("fri"), parse_clock("22:00"), parse_clock("06:00"), 5_000)
    saturday_3am = datetime(2026, 12, 5, 3, 0, tzinfo=UTC)  # belongs to Friday's window
    assert price_seconds(saturday_3am, 3600, 1_000_000, [late]) == 500_000
    sunday_3am = saturday_3am + timedelta(days=1)
    assert price_seconds(sunday_3am, 3600, 1_000_000, [late]) == 1_000_000


def test_overlapping_windows_are_refused() -> None:
    check_no_overlap([NIGHT, OffPeakWindow(frozenset({5, 6}), 8 * 60, 12 * 60, 2_000)])
    with pytest.raises(InvalidInput, match="overlaps"):
        check_no_overlap([NIGHT, OffPeakWindow(frozenset({2}), 7 * 60, 9 * 60, 1_000)])


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (lambda: parse_clock("25:00"), "time of day"),
        (lambda: parse_clock("noon"), "time of day"),
        (lambda: parse_weekdays("funday"), "weekday"),
        (lambda: OffPeakWindow(frozenset({1}), 0, 60, 0), "discount"),
        (lambda: OffPeakWindow(frozenset({1}), 0, 60, 10_001), "discount"),
        (lambda: OffPeakWindow(frozenset(), 0, 60, 100), "weekdays"),
        (lambda: OffPeakWindow(frozenset({1}), 0, 60, 100, tz="Mars/Olympus"), "time zone"),
    ],
)
def test_bad_windows(bad, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidInput, match=words):
        bad()


window_strategy = st.builds(
    OffPeakWindow,
    weekdays=st.frozensets(st.integers(0, 6), min_size=1),
    start_minute=st.integers(0, 1439),
    end_minute=st.integers(0, 1439),
    discount_bp=st.integers(1, 10_000),
    tz=st.sampled_from(["UTC", "Asia/Shanghai", "Europe/Berlin"]),
)


@settings(max_examples=40, deadline=None)
@given(
    start=st.datetimes(
        min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 31), timezones=st.just(UTC)
    ),
    seconds=st.integers(0, 26 * 3600),
    hourly=st.integers(0, 50_000_000),
    windows=st.lists(window_strategy, max_size=3),
)
def test_segment_price_matches_brute_force(
    start: datetime, seconds: int, hourly: int, windows: list[OffPeakWindow]
) -> None:
    windows = [w for w in windows if w.tz == windows[0].tz] if windows else []
    try:
        check_no_overlap(windows)
    except InvalidInput:
        windows = windows[:1]
    assert price_seconds(start, seconds, hourly, windows) == brute_force_price(
        start, seconds, hourly, windows
    )


@settings(max_examples=40, deadline=None)
@given(
    start=st.datetimes(
        min_value=datetime(2026, 1, 1), max_value=datetime(2027, 1, 1), timezones=st.just(UTC)
    ),
    cuts=st.lists(st.integers(0, 40 * 3600), min_size=1, max_size=12),
    window=window_strategy,
)
def test_price_never_decreases_so_ticks_sum_exactly(
    start: datetime, cuts: list[int], window: OffPeakWindow
) -> None:
    charged = 0
    for n in sorted(cuts):
        due = price_seconds(start, n, 2_200_000, [window])
        assert due >= charged
        charged = due
    assert charged == price_seconds(start, max(cuts), 2_200_000, [window])


@pytest.mark.parametrize(
    ("text", "bp"),
    [("40", 4000), ("40%", 4000), (" 12.5 % ", 1250), ("100", 10_000), ("0.01", 1)],
)
def test_a_discount_is_read_as_basis_points(text: str, bp: int) -> None:
    assert parse_discount_bp(text) == bp


@pytest.mark.parametrize(
    "text", ["nan", "NaN", "inf", "-inf", "Infinity", "", "forty", "-5", "0", "100.5", "1e9"]
)
def test_a_discount_outside_0_to_100_is_refused_with_what_is_allowed(text: str) -> None:
    with pytest.raises(InvalidInput, match="at most 100"):
        parse_discount_pct(text)


def test_a_discount_below_one_basis_point_is_refused() -> None:
    with pytest.raises(InvalidInput, match="0.01"):
        parse_discount_bp("0.001")


@pytest.mark.parametrize(
    ("bp", "text"), [(4000, "40"), (1250, "12.5"), (1, "0.01"), (10_000, "100")]
)
def test_a_discount_is_formatted_as_people_type_it(bp: int, text: str) -> None:
    assert format_discount(bp) == text
    assert parse_discount_bp(text) == bp
