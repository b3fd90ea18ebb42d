"""Statement periods: parsing what people type, month edges, and splitting seconds by day."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulease.core.errors import InvalidInput
from gpulease.core.periods import (
    MAX_DAYS,
    month_end,
    parse_date,
    parse_period,
    parse_zone,
    split_by_day,
)

NOW = datetime(2026, 2, 14, 23, 30, tzinfo=UTC)


def test_month_end_knows_leap_years_and_december() -> None:
    assert month_end(date(2024, 2, 10)) == date(2024, 2, 29)
    assert month_end(date(2026, 2, 1)) == date(2026, 2, 28)
    assert month_end(date(2026, 12, 31)) == date(2026, 12, 31)


def test_the_default_period_is_the_month_of_now_in_the_zone() -> None:
    assert parse_period(None, None, "UTC", now=NOW).days()[0] == date(2026, 2, 1)
    tokyo = parse_period(None, None, "Asia/Tokyo", now=datetime(2026, 2, 28, 16, tzinfo=UTC))
    assert (tokyo.start, tokyo.end) == (date(2026, 3, 1), date(2026, 3, 31))


def test_a_period_begins_and_ends_at_local_midnight() -> None:
    berlin = parse_period("2026-07-01", "2026-07-01", "Europe/Berlin", now=NOW)
    assert berlin.begins == datetime(2026, 6, 30, 22, tzinfo=UTC)
    assert berlin.ends == datetime(2026, 7, 1, 22, tzinfo=UTC)
    assert berlin.tz == "Europe/Berlin"


@pytest.mark.parametrize(
    ("start", "end", "says"),
    [
        ("2026-13-01", None, "YYYY-MM-DD"),
        ("yesterday", None, "YYYY-MM-DD"),
        ("2026-02-10", "2026-02-01", "swap them"),
        ("2023-01-01", "2024-01-02", f"at most {MAX_DAYS}"),
        ("9999-12-01", None, "from 1970 to 9998"),
        ("0001-01-01", None, "from 1970 to 9998"),
    ],
)
def test_a_bad_period_is_refused_with_what_to_type(start: str, end: str | None, says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        parse_period(start, end, "UTC", now=NOW)


def test_a_zone_is_an_iana_name_and_empty_is_utc() -> None:
    assert parse_zone(None).key == "UTC" and parse_zone(" ").key == "UTC"
    assert parse_zone("Asia/Tokyo").key == "Asia/Tokyo"
    for bad in ("Mars/Olympus", "../etc/passwd", "\x00"):
        with pytest.raises(InvalidInput, match="Europe/Berlin"):
            parse_zone(bad)


def test_parse_date_names_the_field() -> None:
    with pytest.raises(InvalidInput, match="^to must"):
        parse_date("to", "1.2.2026")


@given(
    st.datetimes(min_value=datetime(2026, 3, 20), max_value=datetime(2026, 4, 5)),
    st.integers(min_value=0, max_value=5 * 86400),
    st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kathmandu"]),
)
def test_the_days_of_a_split_add_up_to_the_seconds_inside_the_period(
    naive: datetime, seconds: int, tz: str
) -> None:
    period = parse_period("2026-03-25", "2026-03-31", tz, now=NOW)
    start = naive.replace(tzinfo=UTC)
    split = split_by_day(period, start, seconds)
    assert all(period.start <= day <= period.end and n > 0 for day, n in split.items())
    # brute force: second k belongs to the local day it starts on
    inside = sum(
        1
        for k in range(0, seconds, 3600)
        if period.begins <= start + timedelta(seconds=k) < period.ends
    )
    if seconds % 3600 == 0 and start.microsecond == 0 and start.second == 0 and start.minute == 0:
        assert sum(split.values()) == inside * 3600
    assert sum(split.values()) <= seconds
