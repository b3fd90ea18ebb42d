"""Pricing of usage over time: off-peak windows and the exact price of a segment's seconds.

A segment's second k is [start + k, start + k + 1) and costs the hourly rate in force at its
first instant. Seconds at one rate in a row form a part; each part costs
floor(rate × seconds / 3600) micro-credits. A segment that crosses a window edge is thus
split there and each side priced at its own rate, to the second; the price of n seconds
never decreases as n grows, so a meter can always charge price(n) - already charged.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpulease.core.errors import InvalidInput
from gpulease.core.money import SECONDS_PER_HOUR

MINUTES_PER_DAY = 24 * 60
FULL_BP = 10_000  # basis points: 10,000 = 100 %
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True)
class OffPeakWindow:
    """Local time [start_minute, end_minute) in time zone `tz` on the given weekdays
    (0 = Monday), at a discount in basis points. end_minute <= start_minute means the
    window runs past midnight into the next day (22:00–06:00); it belongs to the weekday it
    starts on."""

    weekdays: frozenset[int]
    start_minute: int
    end_minute: int
    discount_bp: int
    tz: str = "UTC"

    def __post_init__(self) -> None:
        if not self.weekdays or not self.weekdays <= set(range(7)):
            raise InvalidInput("an off-peak window needs weekdays among mon..sun")
        for m in (self.start_minute, self.end_minute):
            if not 0 <= m < MINUTES_PER_DAY:
                raise InvalidInput("window times must be within the day, 00:00 to 23:59")
        if not 0 < self.discount_bp <= FULL_BP:
            raise InvalidInput("a discount must be more than 0 % and at most 100 %")
        self.zone  # noqa: B018 - an unknown zone is refused here

    @property
    def zone(self) -> ZoneInfo:
        try:
            return ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidInput(f"{self.tz!r} is not a time zone") from None

    def covers_minutes(self) -> set[int]:
        """Minutes of the week (0 = Monday 00:00, local) inside this window."""
        length = (self.end_minute - self.start_minute) % MINUTES_PER_DAY or MINUTES_PER_DAY
        week = 7 * MINUTES_PER_DAY
        return {
            (day * MINUTES_PER_DAY + self.start_minute + i) % week
            for day in self.weekdays
            for i in range(length)
        }

    def to_json(self) -> dict[str, object]:
        return {
            "weekdays": sorted(self.weekdays),
            "start_minute": self.start_minute,
            "end_minute": self.end_minute,
            "discount_bp": self.discount_bp,
            "tz": self.tz,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> OffPeakWindow:
        days = data["weekdays"]
        assert isinstance(days, list)
        return cls(
            weekdays=frozenset(int(d) for d in days),
            start_minute=int(str(data["start_minute"])),
            end_minute=int(str(data["end_minute"])),
            discount_bp=int(str(data["discount_bp"])),
            tz=str(data.get("tz", "UTC")),
        )


def parse_clock(text: str) -> int:
    """'08:30' -> 510 minutes after midnight."""
    try:
        hours, minutes = text.strip().split(":")
        value = int(hours) * 60 + int(minutes)
    except ValueError:
        raise InvalidInput(f"{text!r} is not a time of day; write it like 08:00") from None
    if not (0 <= int(hours) <= 24 and 0 <= int(minutes) < 60) or value > MINUTES_PER_DAY:
        raise InvalidInput(f"{text!r} is not a time of day; write it like 08:00")
    return value % MINUTES_PER_DAY


def parse_discount_pct(text: str) -> Decimal:
    """An operator-typed discount: '40', '40%', '12.5 %' -> Decimal('12.5').

    Refuses anything but a finite number more than 0 and at most 100 (no nan, inf or
    negative values), with a message saying what is allowed.
    """
    cleaned = text.strip().rstrip("%").strip()
    try:
        percent = Decimal(cleaned)
    except InvalidOperation:
        percent = Decimal("NaN")
    if not percent.is_finite():
        raise InvalidInput(
            f"discount {text!r} is not a number; write a percentage above 0 and at most 100, "
            "like 40 or 12.5"
        )
    if not 0 < percent <= 100:
        raise InvalidInput(
            f"discount {text!r} is out of range; a discount is above 0 % and at most 100 %"
        )
    return percent


def parse_discount_bp(text: str) -> int:
    """An operator-typed discount in basis points ('12.5 %' -> 1250); see parse_discount_pct.
    Finer than a basis point rounds to the nearest one (half to even); a discount that
    rounds to 0 is refused."""
    basis_points = int((parse_discount_pct(text) * FULL_BP / 100).to_integral_value())
    if basis_points <= 0:
        raise InvalidInput(f"discount {text!r} is below 0.01 %; write at least 0.01")
    return basis_points


def format_discount(discount_bp: int) -> str:
    """Basis points as the percentage people type: 4000 -> '40', 1250 -> '12.5'."""
    whole, rest = divmod(discount_bp, 100)
    return f"{whole}.{rest:02d}".rstrip("0").rstrip(".") if rest else str(whole)


def parse_weekdays(text: str) -> frozenset[int]:
    """'mon-fri', 'sat,sun', 'all' -> weekday numbers (0 = Monday)."""
    text = text.strip().lower()
    if text in ("all", "*", "daily", "every day"):
        return frozenset(range(7))
    days: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        try:
            a = WEEKDAYS.index(first[:3])
            b = WEEKDAYS.index(last[:3]) if last else a
        except ValueError:
            raise InvalidInput(
                f"{part!r} is not a weekday; use mon..sun, ranges like mon-fri, or 'all'"
            ) from None
        days.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return frozenset(days)


def check_no_overlap(windows: Sequence[OffPeakWindow]) -> None:
    """Refuse windows that share a minute of the week: one instant has one discount.
    Windows are compared in their local time; an operator keeps them in one zone."""
    seen: set[int] = set()
    for window in windows:
        minutes = window.covers_minutes()
        if seen & minutes:
            raise InvalidInput(
                "this window overlaps an existing off-peak window; change its days or hours "
                "or remove the other first"
            )
        seen |= minutes


def discount_at(instant: datetime, windows: Sequence[OffPeakWindow]) -> int:
    """The discount (basis points) in force at an instant."""
    for w in windows:
        local = instant.astimezone(w.zone)
        minute = local.hour * 60 + local.minute
        today, yesterday = local.weekday(), (local.weekday() - 1) % 7
        if w.end_minute > w.start_minute:
            if today in w.weekdays and w.start_minute <= minute < w.end_minute:
                return w.discount_bp
        else:  # runs past midnight
            if today in w.weekdays and minute >= w.start_minute:
                return w.discount_bp
            if yesterday in w.weekdays and minute < w.end_minute:
                return w.discount_bp
    return 0


def discounted(hourly_micro: int, discount_bp: int) -> int:
    """The hourly rate after a discount, floored to the micro-credit."""
    return hourly_micro * (FULL_BP - discount_bp) // FULL_BP


def _edges(start: datetime, end: datetime, windows: Sequence[OffPeakWindow]) -> list[datetime]:
    """Every window start and end instant in (start, end), in UTC, sorted."""
    found = set()
    for w in windows:
        tz = w.zone
        day: date = start.astimezone(tz).date() - timedelta(days=1)
        last = end.astimezone(tz).date() + timedelta(days=1)
        while day <= last:
            for minute in (w.start_minute, w.end_minute):
                local = datetime.combine(day, time(minute // 60, minute % 60), tz)
                instant = local.astimezone(UTC)
                if start < instant < end:
                    found.add(instant)
            day += timedelta(days=1)
    return sorted(found)


def _first_second_at_or_after(start: datetime, instant: datetime) -> int:
    """The smallest k with start + k >= instant."""
    delta = instant - start
    micro = delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds
    return max(0, -(-micro // 1_000_000))


def rate_parts(
    start: datetime, seconds: int, hourly_micro: int, windows: Sequence[OffPeakWindow]
) -> list[tuple[int, int]]:
    """(rate, seconds) for each maximal run of seconds at one rate, in order."""
    if seconds <= 0:
        return []
    end = start + timedelta(seconds=seconds)
    cuts = [0] + [_first_second_at_or_after(start, e) for e in _edges(start, end, windows)]
    cuts = sorted({c for c in cuts if c < seconds}) + [seconds]
    parts: list[tuple[int, int]] = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        if b <= a:
            continue
        rate = discounted(hourly_micro, discount_at(start + timedelta(seconds=a), windows))
        if parts and parts[-1][0] == rate:
            parts[-1] = (rate, parts[-1][1] + b - a)
        else:
            parts.append((rate, b - a))
    return parts


def price_seconds(
    start: datetime, seconds: int, hourly_micro: int, windows: Sequence[OffPeakWindow] = ()
) -> int:
    """The price of a segment's first `seconds` seconds, exact to the micro-credit."""
    parts = rate_parts(start, seconds, hourly_micro, windows)
    return sum(rate * n // SECONDS_PER_HOUR for rate, n in parts)


def in_window(instant: datetime, windows: Iterable[OffPeakWindow]) -> bool:
    return discount_at(instant, list(windows)) > 0
