"""The operator's console: nodes and their GPU heat map, users and grants, prices and vouchers.

Admins only: a signed-in user who is not an admin gets the same 404 as a page that does not
exist, and a visitor who is not signed in goes to the login page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Query, Request, Response
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from gpulease.core.errors import GpuleaseError, InvalidInput
from gpulease.core.money import format_credits, ncu
from gpulease.core.pricing import FULL_BP, WEEKDAYS, OffPeakWindow, parse_clock, parse_weekdays
from gpulease.schemas.accounts import UserPublic
from gpulease.schemas.statements import RevenueTotals
from gpulease.server.db import utcnow
from gpulease.server.orm import User
from gpulease.server.routers.auth_limits import auth_guard
from gpulease.server.routers.deps import credits, runtime, same_origin, tx
from gpulease.server.routers.ui.account import cross_site_refusal
from gpulease.server.routers.ui.guards import login_url, viewer
from gpulease.server.routers.ui.templating import render
from gpulease.server.services import grants, metrics, operator_views, statements, users
from gpulease.server.services.billing import limits, offpeak, plans, vouchers

router = APIRouter(prefix="/admin")

FormText = Annotated[str, Form(max_length=200)]
HEATMAP_MINUTES = 60
HEATMAP_BUCKET_S = 60
# How often the heat map and the node table's readings refresh, in milliseconds.
REFRESH_MS = 15_000
MAX_VOUCHER_USES = 1_000_000


class NotAdmin(Exception):
    """Raised inside a page to answer 404 (signed in, not an admin) or go to the login."""

    def __init__(self, response: Response) -> None:
        self.response = response


def _admin(session: Session, request: Request) -> User:
    user = viewer(session, request)
    if user is None:
        raise NotAdmin(RedirectResponse(login_url(request), status_code=303))
    if user.role != "admin":
        context = {"title": "Page not found", "message": f"There is no page {request.url.path}."}
        public = UserPublic.model_validate(user)
        raise NotAdmin(render(request, "errors/error.html", context, user=public, status_code=404))
    return user


@dataclass(frozen=True)
class RevenueSummary:
    start: str
    end: str
    tz: str
    totals: RevenueTotals


def _revenue_summary(session: Session, request: Request) -> RevenueSummary:
    """This month's revenue in the operator's zone (the Billing page has it by day)."""
    rt = runtime(request)
    period = statements.parse_period(None, None, rt.settings.timezone)
    found = statements.revenue(session, period, rt.catalog)
    return RevenueSummary(str(found.start), str(found.end), found.tz, found.totals)


def _page(
    request: Request,
    template: str,
    load: Callable[[Session, User], dict[str, Any]],
    *,
    tab: str,
    error: str = "",
    notice: str = "",
    status_code: int = 200,
) -> Response:
    """An admin page: the gate, then load(session, admin) for the page's own context."""
    with tx(request) as session:
        try:
            admin = _admin(session, request)
        except NotAdmin as refusal:
            return refusal.response
        context = load(session, admin)
        context.update(
            tab=tab,
            error=error,
            notice=notice,
            revenue=_revenue_summary(session, request),
        )
        public = UserPublic.model_validate(admin)
    return render(request, template, context, user=public, page="admin", status_code=status_code)


def _refuse_cross_site(request: Request) -> Response | None:
    return None if same_origin(request) else cross_site_refusal(request)


# -- nodes ------------------------------------------------------------------------------------


@router.get("")
@router.get("/nodes")
def nodes_page(request: Request) -> Response:
    def load(session: Session, admin: User) -> dict[str, Any]:
        fleet = operator_views.fleet(session)
        readings = {
            gpu["uuid"]: _reading(gpu["sample"])
            for gpu in metrics.latest_gpu_samples(session)
            if gpu["sample"] is not None
        }
        return {
            "nodes": fleet,
            "readings": readings,
            "gpu_total": sum(len(n.gpus) for n in fleet),
            "gpu_held": sum(n.held for n in fleet),
            "gpu_simulated": sum(1 for n in fleet for g in n.gpus if g.simulated),
            "heatmap_src": "/api/v1/admin/gpu-heatmap?"
            + urlencode({"minutes": HEATMAP_MINUTES, "bucket_s": HEATMAP_BUCKET_S}),
            "refresh_ms": REFRESH_MS,
        }

    return _page(request, "admin/nodes.html", load, tab="nodes")


def _reading(sample: dict[str, Any]) -> str:
    """A GPU's newest sample in a few words: '93 % · 1.2 of 80.0 GiB · 61 °C · 250 W'."""
    parts = []
    if sample["util_pct"] is not None:
        parts.append(f"{sample['util_pct']:.0f} %")
    used, total = sample["memory_used_mb"], sample["memory_total_mb"]
    if used is not None:
        parts.append(f"{used / 1024:.1f}" + (f" of {total / 1024:.1f} GiB" if total else " GiB"))
    if sample["temperature_c"] is not None:
        parts.append(f"{sample['temperature_c']:.0f} °C")
    if sample["power_w"] is not None:
        parts.append(f"{sample['power_w']:.0f} W")
    return " · ".join(parts) or "a sample with no values"


# -- users and grants -------------------------------------------------------------------------


@dataclass(frozen=True)
class GrantForm:
    user: str = ""
    amount: str = ""
    memo: str = ""


@dataclass(frozen=True)
class UserRow:
    account: operator_views.UserAccount
    balance: str
    balance_ncu: str
    hourly_spend: str
    max_hourly: str
    monthly_budget: str
    admin_max_hourly: str
    admin_monthly_budget: str


def _users_page(
    request: Request,
    *,
    form: GrantForm | None = None,
    error: str = "",
    notice: str = "",
    status_code: int = 200,
) -> Response:
    catalog = runtime(request).catalog
    symbol = catalog.currency_symbol

    def money(micro: int | None) -> str:
        return "—" if micro is None else format_credits(micro, symbol, 2)

    def load(session: Session, admin: User) -> dict[str, Any]:
        rows = [
            UserRow(
                account=a,
                balance=format_credits(a.balance_micro, symbol),
                balance_ncu=f"{ncu(a.balance_micro, catalog.ncu_reference_hourly_micro):.4f}",
                hourly_spend=format_credits(a.hourly_spend_micro, symbol) + "/h",
                max_hourly=money(a.caps.hourly),
                monthly_budget=money(a.caps.monthly),
                admin_max_hourly=money(a.caps.admin_max_hourly_micro),
                admin_monthly_budget=money(a.caps.admin_monthly_budget_micro),
            )
            for a in operator_views.user_accounts(session)
        ]
        context = {"rows": rows, "form": form or GrantForm(), "symbol": symbol}
        context["failed_logins"] = auth_guard(request).failed_logins(20)
        return context

    return _page(
        request,
        "admin/users.html",
        load,
        tab="users",
        error=error,
        notice=notice,
        status_code=status_code,
    )


@router.get("/users")
def users_page(
    request: Request, granted: Annotated[int | None, Query(ge=1)] = None, capped: str = ""
) -> Response:
    notice = ""
    if granted is not None:
        with tx(request) as session:
            found = grants.describe_grant(session, granted)
        if found is not None:
            name, micro = found
            amount = format_credits(micro, runtime(request).catalog.currency_symbol)
            notice = f"Granted {amount} to {name}."
    elif capped:
        notice = f"Saved the caps of {capped[:64]}."
    return _users_page(request, notice=notice)


@router.post("/users/grant")
def grant(
    request: Request, user: FormText = "", amount: FormText = "", memo: FormText = ""
) -> Response:
    """Credit a user's wallet; the amount is parsed as everywhere else (12.50, $12.50)."""
    if (refused := _refuse_cross_site(request)) is not None:
        return refused
    typed = GrantForm(user.strip(), amount.strip(), memo.strip())
    try:
        if not typed.user:
            raise InvalidInput("choose the user to grant credit to")
        micro = credits(typed.amount, "amount")
        if micro is None:
            raise InvalidInput("enter an amount to grant, like 25.00")
        with tx(request) as session:
            try:
                admin = _admin(session, request)
            except NotAdmin as refusal:
                return refusal.response
            txn = grants.grant_credit(
                session, admin, micro, user=typed.user, memo=typed.memo or "admin grant"
            )
            granted = txn.id
    except GpuleaseError as exc:
        return _users_page(request, form=typed, error=exc.message, status_code=exc.status)
    return RedirectResponse(f"/admin/users?granted={granted}", status_code=303)


@router.post("/users/{name}/caps")
def set_caps(
    request: Request, name: str, max_hourly: FormText = "", monthly_budget: FormText = ""
) -> Response:
    """The admin's ceiling on a user's hourly spend and monthly budget (empty: no ceiling)."""
    if (refused := _refuse_cross_site(request)) is not None:
        return refused
    rt = runtime(request)
    try:
        hourly = credits(max_hourly, "max hourly spend")
        monthly = credits(monthly_budget, "monthly budget")
        with tx(request) as session:
            try:
                _admin(session, request)
            except NotAdmin as refusal:
                return refusal.response
            target = users.get_user_by_name(session, name)
            limits.set_admin_caps(
                session,
                target.id,
                utcnow(),
                max_hourly_micro=hourly,
                monthly_budget_micro=monthly,
                symbol=rt.catalog.currency_symbol,
            )
    except GpuleaseError as exc:
        return _users_page(request, error=exc.message, status_code=exc.status)
    return RedirectResponse("/admin/users?" + urlencode({"capped": name}), status_code=303)


# -- prices, off-peak windows, vouchers -------------------------------------------------------


@dataclass(frozen=True)
class PriceRow:
    name: str
    is_gpu: bool
    memory_gb: float
    ncu_factor: str
    hourly: str
    daily: str
    daily_saving: str
    spot: str


@dataclass(frozen=True)
class WindowRow:
    id: int
    weekdays: str
    start: str
    end: str
    discount: str
    tz: str


@dataclass(frozen=True)
class VoucherRow:
    code: str
    amount: str
    used: int
    max_redemptions: int
    per_user_limit: int
    expires: str
    expired: bool


@dataclass(frozen=True)
class OffPeakForm:
    weekdays: str = "all"
    start: str = "22:00"
    end: str = "06:00"
    discount: str = "30"


@dataclass(frozen=True)
class VoucherForm:
    amount: str = ""
    code: str = ""
    max_redemptions: str = "1"
    per_user_limit: str = "1"
    expires: str = ""


@dataclass(frozen=True)
class PriceForms:
    offpeak: OffPeakForm = field(default_factory=OffPeakForm)
    voucher: VoucherForm = field(default_factory=VoucherForm)


def _clock(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


def _days(days: frozenset[int]) -> str:
    if len(days) == 7:
        return "every day"
    return ", ".join(WEEKDAYS[d] for d in sorted(days))


def _prices_page(
    request: Request,
    *,
    forms: PriceForms | None = None,
    error: str = "",
    notice: str = "",
    status_code: int = 200,
) -> Response:
    rt = runtime(request)
    catalog = rt.catalog
    symbol = catalog.currency_symbol

    def load(session: Session, admin: User) -> dict[str, Any]:
        prices = []
        for m in catalog.models:
            block = plans.block_price(m, 1)
            saving = m.hourly_micro * 24 - block
            prices.append(
                PriceRow(
                    name=m.name,
                    is_gpu=m.is_gpu,
                    memory_gb=m.memory_gb,
                    ncu_factor=f"{m.ncu_factor:g}",
                    hourly=format_credits(m.hourly_micro, symbol),
                    daily=format_credits(block, symbol, 2) if block else "—",
                    daily_saving=f"{saving * 100 / (m.hourly_micro * 24):.0f} %"
                    if block and m.hourly_micro
                    else "",
                    spot=format_credits(m.spot_hourly_micro, symbol)
                    if m.spot_hourly_micro
                    else "—",
                )
            )
        now = utcnow()
        return {
            "prices": prices,
            "pricing_path": str(rt.settings.pricing_path),
            "windows": [
                WindowRow(
                    i,
                    _days(w.weekdays),
                    _clock(w.start_minute),
                    _clock(w.end_minute),
                    f"{w.discount_bp / 100:g} %",
                    w.tz,
                )
                for i, w in offpeak.list_windows(session)
            ],
            "tz": rt.settings.timezone,
            "vouchers": [
                VoucherRow(
                    code=v.code,
                    amount=format_credits(v.amount_micro, symbol, 2),
                    used=used,
                    max_redemptions=v.max_redemptions,
                    per_user_limit=v.per_user_limit,
                    expires=v.expires_at.strftime("%Y-%m-%d %H:%M UTC") if v.expires_at else "",
                    expired=v.expires_at is not None and v.expires_at <= now,
                )
                for v, used in vouchers.list_vouchers(session)
            ],
            "forms": forms or PriceForms(),
            "symbol": symbol,
        }

    return _page(
        request,
        "admin/prices.html",
        load,
        tab="prices",
        error=error,
        notice=notice,
        status_code=status_code,
    )


@router.get("/prices")
def prices_page(request: Request, done: str = "") -> Response:
    notices = {
        "window-added": "Added the off-peak window; instances that start from now on get it.",
        "window-removed": "Removed the off-peak window.",
        "voucher": "Created the voucher.",
    }
    return _prices_page(request, notice=notices.get(done, ""))


def parse_discount(text: str) -> int:
    """'40', '40%', '12.5 %' -> basis points."""
    cleaned = text.strip().rstrip("%").strip()
    try:
        percent = Decimal(cleaned)
    except InvalidOperation:
        percent = Decimal("NaN")
    if not percent.is_finite():
        raise InvalidInput(f"discount {text!r}: write a percentage like 40")
    return int((percent * FULL_BP / 100).to_integral_value())


def _admin_action(request: Request, act: Callable[[Session, User], object]) -> Response | None:
    """Run act as the admin in one transaction; a Response when the gate refused."""
    with tx(request) as session:
        try:
            admin = _admin(session, request)
        except NotAdmin as refusal:
            return refusal.response
        act(session, admin)
    return None


@router.post("/prices/offpeak")
def add_window(
    request: Request,
    weekdays: FormText = "all",
    start: FormText = "",
    end: FormText = "",
    discount: FormText = "",
) -> Response:
    if (refused := _refuse_cross_site(request)) is not None:
        return refused
    typed = OffPeakForm(weekdays, start, end, discount)
    tz = runtime(request).settings.timezone
    try:
        window = OffPeakWindow(
            weekdays=parse_weekdays(weekdays or "all"),
            start_minute=parse_clock(start),
            end_minute=parse_clock(end),
            discount_bp=parse_discount(discount),
            tz=tz,
        )
        gate = _admin_action(request, lambda session, _: offpeak.add_window(session, window))
    except GpuleaseError as exc:
        forms = PriceForms(offpeak=typed)
        return _prices_page(request, forms=forms, error=exc.message, status_code=exc.status)
    return gate or RedirectResponse("/admin/prices?done=window-added", status_code=303)


@router.post("/prices/offpeak/{window_id}/delete")
def remove_window(request: Request, window_id: int) -> Response:
    if (refused := _refuse_cross_site(request)) is not None:
        return refused
    try:
        gate = _admin_action(request, lambda session, _: offpeak.remove_window(session, window_id))
    except GpuleaseError as exc:
        return _prices_page(request, error=exc.message, status_code=exc.status)
    return gate or RedirectResponse("/admin/prices?done=window-removed", status_code=303)


def _count(text: str, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidInput(f"{what} must be a whole number, not {text!r}") from None
    if not 1 <= value <= MAX_VOUCHER_USES:
        raise InvalidInput(f"{what} must be from 1 to {MAX_VOUCHER_USES:,}")
    return value


def _expiry(text: str, tz: str) -> datetime | None:
    """A date typed in the form: the voucher works until the end of that day (operator's zone)."""
    text = text.strip()
    if not text:
        return None
    try:
        day = date.fromisoformat(text) if len(text) == 10 else None
    except ValueError:
        day = None
    if day is None:
        raise InvalidInput(f"the expiry must be a date like 2026-12-31, not {text!r}")
    return datetime.combine(day + timedelta(days=1), time(0), tzinfo=statements.zone(tz))


@router.post("/prices/vouchers")
def create_voucher(
    request: Request,
    amount: FormText = "",
    code: FormText = "",
    max_redemptions: FormText = "1",
    per_user_limit: FormText = "1",
    expires: FormText = "",
) -> Response:
    if (refused := _refuse_cross_site(request)) is not None:
        return refused
    typed = VoucherForm(amount, code, max_redemptions, per_user_limit, expires)
    tz = runtime(request).settings.timezone
    try:
        micro = credits(amount, "amount")
        if micro is None:
            raise InvalidInput("a voucher needs an amount, like 25.00")
        uses = _count(max_redemptions, "max redemptions")
        per_user = _count(per_user_limit, "the per-user limit")
        until = _expiry(expires, tz)
        gate = _admin_action(
            request,
            lambda session, admin: _voucher(session, admin, micro, code, uses, per_user, until),
        )
    except GpuleaseError as exc:
        forms = PriceForms(voucher=typed)
        return _prices_page(request, forms=forms, error=exc.message, status_code=exc.status)
    return gate or RedirectResponse("/admin/prices?done=voucher", status_code=303)


def _voucher(
    session: Session,
    admin: User,
    micro: int,
    code: str,
    uses: int,
    per_user: int,
    until: datetime | None,
) -> None:
    vouchers.create_voucher(
        session,
        admin,
        amount_micro=micro,
        code=code.strip() or None,
        expires_at=until,
        max_redemptions=uses,
        per_user_limit=per_user,
    )
