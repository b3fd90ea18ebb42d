"""Price plans an instance is rented on: on demand, daily blocks, spot.

- on_demand: per second at the hourly price (less any off-peak discount).
- spot: per second at the spot price (less any off-peak discount); may be interrupted.
- daily: a prepaid 24-hour block bought when the instance is placed; its GPUs stay reserved
  for the whole block, stopped or not; unused time is not refunded; with auto_renew the
  next block is bought when one ends while the instance is live, else it stops.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from fractions import Fraction

from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog, GpuModel
from gpulease.core.errors import InvalidInput, PaymentRequired
from gpulease.core.money import format_credits
from gpulease.server.orm import Instance
from gpulease.server.services import ledger

ON_DEMAND, DAILY, SPOT = "on_demand", "daily", "spot"
PLANS = (ON_DEMAND, DAILY, SPOT)
BLOCK = timedelta(hours=24)


def check_plan(plan: str) -> str:
    if plan not in PLANS:
        raise InvalidInput(f"unknown plan {plan!r}; choose one of: {', '.join(PLANS)}")
    return plan


def hourly_rate(model: GpuModel, count: int, plan: str) -> int:
    """What the instance costs per hour while it holds its GPUs (0 for prepaid daily)."""
    units = max(count, 1)
    if plan == SPOT:
        return model.spot_hourly_micro * units
    if plan == DAILY:
        return 0
    return model.hourly_micro * units


def list_price_hourly(model: GpuModel, count: int, plan: str) -> int:
    """The hourly figure people compare: for daily, the block price spread over 24 h."""
    if plan == DAILY:
        return block_price(model, count) // 24
    return hourly_rate(model, count, plan)


def block_price(model: GpuModel, count: int) -> int:
    return model.daily_micro * max(count, 1)


def daily_saving_pct(model: GpuModel) -> int | None:
    """How much cheaper a daily block is than 24 hours on demand, in whole percent (half to
    even); None when the model has no daily price or no hourly one."""
    block = block_price(model, 1)
    full_day = model.hourly_micro * 24
    if not block or not full_day:
        return None
    return round(Fraction((full_day - block) * 100, full_day))


def daily_rules(model: GpuModel, count: int, symbol: str) -> str:
    price = format_credits(block_price(model, count), symbol)
    on_demand = format_credits(model.hourly_micro * max(count, 1) * 24, symbol)
    return (
        f"Daily plan: {price} buys 24 hours of {model.name} × {max(count, 1)} "
        f"(24 h on demand would cost {on_demand}). It is charged when the instance is placed "
        "on GPUs; the GPUs stay reserved for you for the whole block, even while the instance "
        "is stopped; unused time is not refunded. With auto-renew the next block is bought "
        "when this one ends if the instance is running and your balance allows; otherwise it "
        "stops at the end of the block and its workspace is kept."
    )


def buy_block(session: Session, instance: Instance, catalog: Catalog, now: datetime) -> int:
    """Charge the next 24-hour block and reserve the GPUs until its end. Returns the price."""
    model = catalog.get(instance.gpu_model)
    price = block_price(model, instance.gpu_count)
    available = ledger.balance(session, instance.owner_id, instance.team_id)
    if available < price:
        raise PaymentRequired(
            f"a daily block of {model.name} × {max(instance.gpu_count, 1)} costs "
            f"{format_credits(price, catalog.currency_symbol)}; the wallet holds "
            f"{format_credits(available, catalog.currency_symbol)}"
        )
    block = instance.daily_blocks + 1
    ledger.charge(
        session,
        instance.owner_id,
        price,
        key=f"daily:{instance.id}:{block}",
        memo=f"daily block {block} of {instance.name} "
        f"({model.name} × {max(instance.gpu_count, 1)})",
        kind="daily_block",
        team_id=instance.team_id,
        instance_id=instance.id,
        at=now,
    )
    instance.daily_blocks = block
    instance.reserved_until = now + BLOCK
    return price


def holds_reservation(instance: Instance, now: datetime) -> bool:
    return (
        instance.plan == DAILY
        and instance.reserved_until is not None
        and instance.reserved_until > now
    )
