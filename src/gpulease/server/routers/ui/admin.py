"""The operator's console: nodes and their GPU heat map, users and grants, prices and vouchers.

Admins only: a signed-in user who is not an admin gets the same 404 as a page that does not
exist, and a visitor who is not signed in goes to the login page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Form, Query, Response
from pydantic import ConfigDict

from gpulease.core.errors import GpuleaseError, InvalidInput
from gpulease.core.money import format_cap, format_credits, ncu
from gpulease.core.pricing import OffPeakWindow, parse_clock, parse_discount_bp, parse_weekdays
from gpulease.schemas.statements import RevenueTotals
from gpulease.server.db import utcnow
from gpulease.server.routers.auth_limits import auth_guard
from gpulease.server.routers.deps import credits
from gpulease.server.routers.ui.billing import WindowView, windows_view
from gpulease.server.routers.ui.forms import FormBody
from gpulease.server.routers.ui.guards import AdminForm, AdminPage, ConsolePage, console_router
from gpulease.server.services import grants, metrics, operator_views, statements, users
from gpulease.server.services.billing import limits, offpeak, plans, vouchers

router = console_router(prefix="/admin")

FormText = Annotated[str, Form(max_length=200)]
HEATMAP_MINUTES = 60
HEATMAP_BUCKET_S = 60
# How often the heat map and the node table's readings refresh, in milliseconds.
REFRESH_MS = 15_000


@dataclass(frozen=True)
class RevenueSummary:
    start: str
    end: str
    tz: str
    totals: RevenueTotals


def _revenue_summary(console: ConsolePage) -> RevenueSummary:
    """This month's revenue in the operator's zone (the Billing page has it by day)."""
    rt = console.runtime
    period = statements.parse_period(None, None, rt.settings.timezone)
    found = statements.revenue(console.session, period, rt.catalog)
    return RevenueSummary(str(found.start), str(found.end), found.tz, found.totals)


def _page(
    console: ConsolePage,
    template: str,
    context: dict[str, Any],
    *,
    tab: str,
    refusal: GpuleaseError | None = None,
    notice: str = "",
) -> Response:
    """An admin page: its own context, the tabs, this month's revenue, a refusal's message."""
    context.update(tab=tab, notice=notice, revenue=_revenue_summary(console))
    return console.form_page(template, context, refusal, page="admin")


# -- nodes ------------------------------------------------------------------------------------


@router.get("")
@router.get("/nodes")
def nodes_page(console: AdminPage) -> Response:
    session = console.session
    fleet = operator_views.fleet(session)
    readings = {
        gpu["uuid"]: _reading(gpu["sample"])
        for gpu in metrics.latest_gpu_samples(session)
        if gpu["sample"] is not None
    }
    context = {
        "nodes": fleet,
        "readings": readings,
        "gpu_total": sum(len(n.gpus) for n in fleet),
        "gpu_held": sum(n.held for n in fleet),
        "gpu_simulated": sum(1 for n in fleet for g in n.gpus if g.simulated),
        "heatmap_src": "/api/v1/admin/gpu-heatmap?"
        + urlencode({"minutes": HEATMAP_MINUTES, "bucket_s": HEATMAP_BUCKET_S}),
        "refresh_ms": REFRESH_MS,
    }
    return _page(console, "admin/nodes.html", context, tab="nodes")


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


class AdminFormBody(FormBody):
    """An admin form: each text field at most 200 characters."""

    model_config = ConfigDict(str_max_length=200)


class GrantForm(AdminFormBody):
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
    console: ConsolePage,
    form: GrantForm | None = None,
    refusal: GpuleaseError | None = None,
    *,
    notice: str = "",
) -> Response:
    catalog = console.runtime.catalog
    symbol = catalog.currency_symbol

    def money(micro: int | None) -> str:
        return format_cap(micro, symbol, unset="—")

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
        for a in operator_views.user_accounts(console.session)
    ]
    context = {"rows": rows, "form": form or GrantForm(), "symbol": symbol}
    context["failed_logins"] = auth_guard(console.request).failed_logins(console.session, 20)
    return _page(console, "admin/users.html", context, tab="users", refusal=refusal, notice=notice)


@router.get("/users")
def users_page(
    console: AdminPage, granted: Annotated[int | None, Query(ge=1)] = None, capped: str = ""
) -> Response:
    notice = ""
    if granted is not None:
        found = grants.describe_grant(console.session, granted)
        if found is not None:
            name, micro = found
            amount = format_credits(micro, console.runtime.catalog.currency_symbol)
            notice = f"Granted {amount} to {name}."
    elif capped:
        notice = f"Saved the caps of {capped[:64]}."
    return _users_page(console, notice=notice)


@router.post("/users/grant")
def grant(console: AdminForm, form: Annotated[GrantForm, Form()]) -> Response:
    """Credit a user's wallet; the amount is parsed as everywhere else (12.50, $12.50)."""
    typed = form.stripped()

    def act() -> str:
        if not typed.user:
            raise InvalidInput("choose the user to grant credit to")
        micro = credits(typed.amount, "amount")
        if micro is None:
            raise InvalidInput("enter an amount to grant, like 25.00")
        memo = typed.memo or "admin grant"
        txn = grants.grant_credit(console.session, console.user, micro, user=typed.user, memo=memo)
        return f"/admin/users?granted={txn.id}"

    return console.act(act, lambda exc: _users_page(console, typed, exc))


@router.post("/users/{name}/caps")
def set_caps(
    console: AdminForm, name: str, max_hourly: FormText = "", monthly_budget: FormText = ""
) -> Response:
    """The admin's ceiling on a user's hourly spend and monthly budget (empty: no ceiling)."""

    def act() -> str:
        hourly = credits(max_hourly, "max hourly spend")
        monthly = credits(monthly_budget, "monthly budget")
        target = users.get_user_by_name(console.session, name)
        limits.set_admin_caps(
            console.session,
            target.id,
            utcnow(),
            max_hourly_micro=hourly,
            monthly_budget_micro=monthly,
            symbol=console.runtime.catalog.currency_symbol,
        )
        return "/admin/users?" + urlencode({"capped": name})

    return console.act(act, lambda exc: _users_page(console, refusal=exc))


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
class VoucherRow:
    code: str
    amount: str
    used: int
    max_redemptions: int
    per_user_limit: int
    expires: str
    expired: bool


class OffPeakForm(AdminFormBody):
    weekdays: str = "all"
    start: str = ""
    end: str = ""
    discount: str = ""


OFFPEAK_SHOWN = OffPeakForm(start="22:00", end="06:00", discount="30")


class VoucherForm(AdminFormBody):
    amount: str = ""
    code: str = ""
    max_redemptions: str = "1"
    per_user_limit: str = "1"
    expires: str = ""


@dataclass(frozen=True)
class PriceForms:
    offpeak: OffPeakForm = OFFPEAK_SHOWN
    voucher: VoucherForm = field(default_factory=VoucherForm)


def _price_rows(console: ConsolePage) -> list[PriceRow]:
    symbol = console.runtime.catalog.currency_symbol
    rows = []
    for m in console.runtime.catalog.models:
        block = plans.block_price(m, 1)
        saving = plans.daily_saving_pct(m)
        rows.append(
            PriceRow(
                name=m.name,
                is_gpu=m.is_gpu,
                memory_gb=m.memory_gb,
                ncu_factor=f"{m.ncu_factor:g}",
                hourly=format_credits(m.hourly_micro, symbol),
                daily=format_credits(block, symbol) if block else "—",
                daily_saving="" if saving is None else f"{saving} %",
                spot=format_credits(m.spot_hourly_micro, symbol) if m.spot_hourly_micro else "—",
            )
        )
    return rows


def _voucher_rows(console: ConsolePage) -> list[VoucherRow]:
    symbol = console.runtime.catalog.currency_symbol
    now = utcnow()
    return [
        VoucherRow(
            code=v.code,
            amount=format_credits(v.amount_micro, symbol, 2),
            used=used,
            max_redemptions=v.max_redemptions,
            per_user_limit=v.per_user_limit,
            expires=v.expires_at.strftime("%Y-%m-%d %H:%M UTC") if v.expires_at else "",
            expired=v.expires_at is not None and v.expires_at <= now,
        )
        for v, used in vouchers.list_vouchers(console.session)
    ]


def _prices_page(
    console: ConsolePage,
    forms: PriceForms | None = None,
    refusal: GpuleaseError | None = None,
    *,
    notice: str = "",
) -> Response:
    settings = console.runtime.settings
    windows: list[WindowView] = windows_view(console.session)
    context = {
        "prices": _price_rows(console),
        "pricing_path": str(settings.pricing_path),
        "windows": windows,
        "tz": settings.timezone,
        "vouchers": _voucher_rows(console),
        "forms": forms or PriceForms(),
        "symbol": console.runtime.catalog.currency_symbol,
    }
    return _page(
        console, "admin/prices.html", context, tab="prices", refusal=refusal, notice=notice
    )


@router.get("/prices")
def prices_page(console: AdminPage, done: str = "") -> Response:
    notices = {
        "window-added": "Added the off-peak window; instances that start from now on get it.",
        "window-removed": "Removed the off-peak window.",
        "voucher": "Created the voucher.",
    }
    return _prices_page(console, notice=notices.get(done, ""))


@router.post("/prices/offpeak")
def add_window(console: AdminForm, typed: Annotated[OffPeakForm, Form()]) -> Response:
    def act() -> str:
        window = OffPeakWindow(
            weekdays=parse_weekdays(typed.weekdays or "all"),
            start_minute=parse_clock(typed.start),
            end_minute=parse_clock(typed.end),
            discount_bp=parse_discount_bp(typed.discount),
            tz=console.runtime.settings.timezone,
        )
        offpeak.add_window(console.session, window)
        return "/admin/prices?done=window-added"

    return console.act(act, lambda exc: _prices_page(console, PriceForms(offpeak=typed), exc))


@router.post("/prices/offpeak/{window_id}/delete")
def remove_window(console: AdminForm, window_id: int) -> Response:
    def act() -> str:
        offpeak.remove_window(console.session, window_id)
        return "/admin/prices?done=window-removed"

    return console.act(act, lambda exc: _prices_page(console, refusal=exc))


@router.post("/prices/vouchers")
def create_voucher(console: AdminForm, typed: Annotated[VoucherForm, Form()]) -> Response:
    def act() -> str:
        micro = credits(typed.amount, "amount")
        if micro is None:
            raise InvalidInput("a voucher needs an amount, like 25.00")
        vouchers.create_voucher(
            console.session,
            console.user,
            amount_micro=micro,
            code=typed.code.strip() or None,
            max_redemptions=vouchers.parse_use_limit(typed.max_redemptions, "max redemptions"),
            per_user_limit=vouchers.parse_use_limit(typed.per_user_limit, "the per-user limit"),
            expires_at=vouchers.parse_expiry(
                typed.expires, statements.zone(console.runtime.settings.timezone)
            ),
        )
        return "/admin/prices?done=voucher"

    return console.act(act, lambda exc: _prices_page(console, PriceForms(voucher=typed), exc))
