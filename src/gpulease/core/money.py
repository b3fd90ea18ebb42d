"""Money as integer micro-credits: the one place that parses, multiplies and formats it."""

from __future__ import annotations

from decimal import ROUND_DOWN, Decimal, InvalidOperation

MICRO = 1_000_000
SECONDS_PER_HOUR = 3600
# 1 NCU = one A100 for 24 hours (DESIGN.md); prices in NCU divide by this.
NCU_HOURS = 24


class MoneyError(ValueError):
    """An amount that cannot be a sum of money."""


def parse_credits(text: str | int | Decimal) -> int:
    """'12.5' -> 12_500_000 micro-credits. Refuses floats' binary noise by going via Decimal."""
    try:
        value = Decimal(str(text).strip().lstrip("$"))
    except InvalidOperation as exc:
        raise MoneyError(f"{text!r} is not an amount; write it like 12.50") from exc
    if not value.is_finite():
        raise MoneyError(f"{text!r} is not an amount; write it like 12.50")
    micro = value * MICRO
    if micro != micro.to_integral_value():
        raise MoneyError(f"{text!r} has more than 6 decimals; credits count in millionths")
    return int(micro)


def format_credits(micro: int, symbol: str = "$", decimals: int = 4) -> str:
    """12_345_678 -> '$12.3457'. Rounds toward zero for display only; never feed it back."""
    sign = "-" if micro < 0 else ""
    value = (Decimal(abs(micro)) / MICRO).quantize(Decimal(1).scaleb(-decimals), ROUND_DOWN)
    return f"{sign}{symbol}{value}"


def format_cap(
    micro: int | None, symbol: str = "$", decimals: int = 2, unset: str = "no cap"
) -> str:
    """A cap, budget or limit that may be unset: None -> `unset` ('no cap', '' for a form
    field, '-' in a table), else the amount as format_credits writes it."""
    return unset if micro is None else format_credits(micro, symbol, decimals)


def cost_for_seconds(hourly_micro: int, seconds: int) -> int:
    """Price of `seconds` at `hourly_micro` per hour, floored to the micro-credit.

    Metering always charges cost_for_seconds(rate, total) - already_charged, so the
    flooring happens once per segment, not once per tick: the sum is exact.
    """
    if seconds < 0:
        raise MoneyError("seconds cannot be negative")
    return hourly_micro * seconds // SECONDS_PER_HOUR


def ncu(micro: int, a100_hourly_micro: int) -> Decimal:
    """An amount of money expressed in NCU (one A100 for 24 hours at the catalog price)."""
    if a100_hourly_micro <= 0:
        raise MoneyError("the A100 price must be positive to express amounts in NCU")
    return Decimal(micro) / Decimal(a100_hourly_micro * NCU_HOURS)
