"""An independent reading of the pricing rule, for tests: walk every second."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from gpulease.core.pricing import OffPeakWindow


def brute_force_price(
    start: datetime, seconds: int, hourly: int, windows: list[OffPeakWindow]
) -> int:
    """An independent reading of the rule: walk every second, find its rate from the
    window definitions directly, group equal neighbours, floor each group once."""

    def rate(instant: datetime) -> int:
        for w in windows:
            local = instant.astimezone(ZoneInfo(w.tz))
            minute = local.hour * 60 + local.minute
            length = (w.end_minute - w.start_minute) % 1440 or 1440
            for day_back in (0, 1):
                weekday = (local.weekday() - day_back) % 7
                offset = minute - w.start_minute + day_back * 1440
                if weekday in w.weekdays and 0 <= offset < length:
                    return hourly * (10_000 - w.discount_bp) // 10_000
        return hourly

    total, run_rate, run_len = 0, None, 0
    for k in range(seconds):
        r = rate(start + timedelta(seconds=k))
        if r == run_rate:
            run_len += 1
            continue
        if run_rate is not None:
            total += run_rate * run_len // 3600
        run_rate, run_len = r, 1
    if run_rate is not None:
        total += run_rate * run_len // 3600
    return total
