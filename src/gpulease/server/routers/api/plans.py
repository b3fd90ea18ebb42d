"""Price plans and their rules, off-peak windows, vouchers, spending caps."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from gpulease.core.catalog import parse_accelerators
from gpulease.core.errors import InvalidInput
from gpulease.core.money import format_credits, ncu
from gpulease.core.pricing import (
    WEEKDAYS,
    OffPeakWindow,
    format_discount,
    parse_clock,
    parse_discount_bp,
    parse_weekdays,
)
from gpulease.core.records import from_attributes
from gpulease.schemas.billing import (
    AdminLimitsUpdate,
    LimitsPublic,
    LimitsUpdate,
    OffPeakCreate,
    OffPeakPublic,
    PlanQuote,
    VoucherCreate,
    VoucherPublic,
    VoucherRedeem,
)
from gpulease.schemas.ledger import Balance
from gpulease.server.orm import Voucher
from gpulease.server.routers.api.clock import Now
from gpulease.server.routers.api.presenters import balance_public
from gpulease.server.routers.deps import (
    AdminUser,
    CurrentUser,
    IdPath,
    SessionDep,
    credits,
    runtime,
)
from gpulease.server.services import ledger, users
from gpulease.server.services.billing import limits, offpeak, plans, vouchers

router = APIRouter(tags=["billing"])


@router.get("/plans")
def quote_plans(_: CurrentUser, request: Request, gpu: str) -> list[PlanQuote]:
    """Every plan's price for a GPU request, with the rules shown before a purchase."""
    catalog = runtime(request).catalog
    name, count = parse_accelerators(gpu)
    model = catalog.get(name)
    symbol = catalog.currency_symbol
    quotes = []
    for plan in plans.PLANS:
        hourly = plans.list_price_hourly(model, count, plan)
        block = plans.block_price(model, count) if plan == plans.DAILY else None
        rules = {
            plans.ON_DEMAND: "billed per second at the hourly price while the instance holds "
            "its GPUs; off-peak windows discount it",
            plans.SPOT: "billed per second at the spot price (off-peak discounts apply too); "
            "the instance may be interrupted when the GPUs are needed",
            plans.DAILY: plans.daily_rules(model, count, symbol),
        }[plan]
        quotes.append(
            PlanQuote(
                plan=plan,
                hourly_micro=hourly,
                hourly=format_credits(hourly, symbol),
                hourly_ncu=f"{ncu(hourly, catalog.ncu_reference_hourly_micro):.6f}",
                block_micro=block,
                rules=rules,
            )
        )
    return quotes


def _window_public(window_id: int, w: OffPeakWindow) -> OffPeakPublic:
    def clock(m: int) -> str:
        return f"{m // 60:02d}:{m % 60:02d}"

    return OffPeakPublic(
        id=window_id,
        weekdays=[WEEKDAYS[d] for d in sorted(w.weekdays)],
        start=clock(w.start_minute),
        end=clock(w.end_minute),
        discount_percent=format_discount(w.discount_bp),
        tz=w.tz,
    )


@router.get("/offpeak")
def list_offpeak(session: SessionDep, _: CurrentUser) -> list[OffPeakPublic]:
    return [_window_public(i, w) for i, w in offpeak.list_windows(session)]


@router.post("/admin/offpeak", status_code=201)
def add_offpeak(
    body: OffPeakCreate, session: SessionDep, _: AdminUser, request: Request
) -> OffPeakPublic:
    window = OffPeakWindow(
        weekdays=parse_weekdays(body.weekdays),
        start_minute=parse_clock(body.start),
        end_minute=parse_clock(body.end),
        discount_bp=parse_discount_bp(body.discount),
        tz=runtime(request).settings.timezone,
    )
    return _window_public(offpeak.add_window(session, window), window)


@router.delete("/admin/offpeak/{window_id}", status_code=204)
def remove_offpeak(window_id: IdPath, session: SessionDep, _: AdminUser) -> Response:
    offpeak.remove_window(session, window_id)
    return Response(status_code=204)


def _voucher_public(v: Voucher, used: int, symbol: str) -> VoucherPublic:
    return VoucherPublic(
        id=v.id,
        code=v.code,
        amount_micro=v.amount_micro,
        amount=format_credits(v.amount_micro, symbol),
        expires_at=v.expires_at,
        max_redemptions=v.max_redemptions,
        per_user_limit=v.per_user_limit,
        used=used,
    )


@router.post("/admin/vouchers", status_code=201)
def create_voucher(
    body: VoucherCreate, session: SessionDep, admin: AdminUser, request: Request
) -> VoucherPublic:
    amount = credits(body.amount, "amount")
    if amount is None:
        raise InvalidInput("a voucher needs an amount, e.g. 25.00")
    voucher = vouchers.create_voucher(
        session,
        admin,
        amount_micro=amount,
        code=body.code,
        expires_at=body.expires_at,
        max_redemptions=body.max_redemptions,
        per_user_limit=body.per_user_limit,
    )
    return _voucher_public(voucher, 0, runtime(request).catalog.currency_symbol)


@router.get("/admin/vouchers")
def list_vouchers(session: SessionDep, _: AdminUser, request: Request) -> list[VoucherPublic]:
    symbol = runtime(request).catalog.currency_symbol
    return [_voucher_public(v, n, symbol) for v, n in vouchers.list_vouchers(session)]


@router.post("/vouchers/redeem")
def redeem_voucher(
    body: VoucherRedeem, session: SessionDep, user: CurrentUser, request: Request
) -> Balance:
    vouchers.redeem(session, user, body.code)
    return balance_public(ledger.balance(session, user.id), runtime(request).catalog)


def _limits_public(session: Session, user_id: int, now: datetime) -> LimitsPublic:
    caps = limits.caps_of(session, user_id)
    return from_attributes(
        LimitsPublic,
        caps,
        effective_max_hourly_micro=caps.hourly,
        effective_monthly_budget_micro=caps.monthly,
        hourly_spend_micro=limits.hourly_spend(session, user_id),
        month_spend_micro=limits.month_spend(session, user_id, now),
    )


@router.get("/limits")
def show_limits(session: SessionDep, user: CurrentUser, now: Now) -> LimitsPublic:
    return _limits_public(session, user.id, now)


@router.put("/limits")
def set_limits(
    body: LimitsUpdate, session: SessionDep, user: CurrentUser, request: Request, now: Now
) -> LimitsPublic:
    limits.set_user_caps(
        session,
        user.id,
        now,
        max_hourly_micro=credits(body.max_hourly, "max hourly spend"),
        monthly_budget_micro=credits(body.monthly_budget, "monthly budget"),
        low_balance_micro=credits(body.low_balance, "low-balance threshold"),
        symbol=runtime(request).catalog.currency_symbol,
    )
    return _limits_public(session, user.id, now)


@router.put("/admin/users/{name}/limits")
def set_admin_limits(
    name: str,
    body: AdminLimitsUpdate,
    session: SessionDep,
    _: AdminUser,
    request: Request,
    now: Now,
) -> LimitsPublic:
    user = users.get_user_by_name(session, name)
    limits.set_admin_caps(
        session,
        user.id,
        now,
        max_hourly_micro=credits(body.max_hourly, "max hourly spend"),
        monthly_budget_micro=credits(body.monthly_budget, "monthly budget"),
        symbol=runtime(request).catalog.currency_symbol,
    )
    return _limits_public(session, user.id, now)
