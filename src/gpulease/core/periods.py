"""Statement periods: whole days in a time zone, and GPU time split at their midnights.

Pure arithmetic, no I/O: a period is parsed from what people type (with the current time
given, never read), and a segment's seconds are bucketed into the days they start in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpulease.core.errors import InvalidInput

MAX_DAYS = 366
DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
MICROSECONDS = 1_000_000
# Dates people may ask about: a wider range only overflows datetime at a period's edges.
FIRST_YEAR, LAST_YEAR = 1970, 9998


@dataclass(frozen=True)
class Period:
    """Whole days from start to end (both included) in a time zone."""

    start: date
    end: date
    zone: ZoneInfo

    @property
    def tz(self) -> str:
        return self.zone.key

    def days(self) -> list[date]:
        return [self.start + timedelta(days=i) for i in range((self.end - self.start).days + 1)]

    def midnight(self, day: date) -> datetime:
        """The UTC instant a day begins in the period's zone."""
        return datetime.combine(day, time(0), tzinfo=self.zone).astimezone(UTC)

    @property
    def begins(self) -> datetime:
        return self.midnight(self.start)

    @property
    def ends(self) -> datetime:
        return self.midnight(self.end + timedelta(days=1))

    def day_of(self, moment: datetime) -> date:
        return moment.astimezone(self.zone).date()


def parse_zone(name: str | None) -> ZoneInfo:
    """A time zone by its IANA name ('Europe/Berlin'); empty or None is UTC."""
    text = (name or "UTC").strip() or "UTC"
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            f"tz {text!r} is not a time zone; use a name like UTC or Europe/Berlin"
        ) from None


def parse_date(name: str, text: str) -> date:
    """'2026-11-01' -> date; `name` says which field was wrong."""
    text = text.strip()
    if DATE_RE.match(text):
        try:
            day = date.fromisoformat(text)
        except ValueError:
            pass
        else:
            if FIRST_YEAR <= day.year <= LAST_YEAR:
                return day
            raise InvalidInput(
                f"{name} must be a date from {FIRST_YEAR} to {LAST_YEAR}, not {text!r}"
            )
    raise InvalidInput(f"{name} must be a date like 2026-11-01 (YYYY-MM-DD), not {text!r}")


def month_end(day: date) -> date:
    """The last day of day's month."""
    first_of_next = (day.replace(day=1) + timedelta(days=32)).replace(day=1)
    return first_of_next - timedelta(days=1)


def parse_period(start: str | None, end: str | None, tz: str | None, *, now: datetime) -> Period:
    """A statement's period from what people type. Neither date: this calendar month in the
    zone; only one: the rest of that one's month. At most MAX_DAYS days."""
    where = parse_zone(tz)
    first = parse_date("from", start) if start and start.strip() else None
    last = parse_date("to", end) if end and end.strip() else None
    if first is None and last is None:
        today = now.astimezone(where).date()
        first, last = today.replace(day=1), month_end(today)
    elif first is None:
        assert last is not None
        first = last.replace(day=1)
    elif last is None:
        last = month_end(first)
    if first > last:
        raise InvalidInput(f"from ({first}) is after to ({last}); swap them")
    days = (last - first).days + 1
    if days > MAX_DAYS:
        raise InvalidInput(
            f"from {first} to {last} is {days} days; a statement covers at most {MAX_DAYS} "
            "days, so ask for one year at a time"
        )
    return Period(first, last, where)


def seconds_before(start: datetime, moment: datetime, seconds: int) -> int:
    """How many of a segment's whole seconds (second k starts at start + k) start before
    `moment`: ceil(moment - start), clipped to 0..seconds."""
    micro = (moment - start) // timedelta(microseconds=1)
    return min(max(-(-micro // MICROSECONDS), 0), seconds)


def split_by_day(period: Period, start: datetime, seconds: int) -> dict[date, int]:
    """The seconds of [start, start + seconds) that fall on each day of the period."""
    if seconds <= 0:
        return {}
    out: dict[date, int] = {}
    first = max(period.day_of(start), period.start)
    last = min(period.day_of(start + timedelta(seconds=seconds)), period.end)
    day = first
    while day <= last:
        count = seconds_before(start, period.midnight(day + timedelta(days=1)), seconds)
        count -= seconds_before(start, period.midnight(day), seconds)
        if count:
            out[day] = count
        day += timedelta(days=1)
    return out
