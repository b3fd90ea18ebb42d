"""The console's Billing page: balance, the ledger, the statement of a period, plans and
spending caps, and revenue for admins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlencode

from fastapi import Form, Query, Response
from pydantic import ConfigDict
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog
from gpulease.core.errors import GpuleaseError, InvalidInput
from gpulease.core.money import format_cap, format_credits, ncu
from gpulease.core.pricing import WEEKDAYS, format_discount
from gpulease.schemas.bill import BillLinePublic
from gpulease.schemas.statements import RevenueDay, RevenuePublic, StatementPublic
from gpulease.server.db import utcnow
from gpulease.server.routers.deps import credits
from gpulease.server.routers.ui.forms import FormBody
from gpulease.server.routers.ui.guards import ConsolePage, FormViewer, PageViewer, console_router
from gpulease.server.services import ledger, statements
from gpulease.server.services.billing import limits, offpeak, plans
from gpulease.server.services.statements import bill_lines

router = console_router()

DateQuery = Annotated[str | None, Query(max_length=32)]
FromQuery = Annotated[str | None, Query(alias="from", max_length=32)]

# The daily revenue chart, in SVG user units.
CHART_WIDTH = 1000
CHART_HEIGHT = 190
CHART_LEFT = 64
CHART_RIGHT = 8
CHART_TOP = 12
CHART_BOTTOM = 28


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    title: str


@dataclass(frozen=True)
class AxisLabel:
    x: float
    text: str


@dataclass(frozen=True)
class Chart:
    """A bar chart drawn by the template as inline SVG: no script, no library."""

    width: int
    height: int
    left: int
    top: int
    base: float
    bars: list[Bar]
    labels: list[AxisLabel]
    top_label: str


def revenue_chart(days: list[RevenueDay], symbol: str) -> Chart:
    """Daily revenue as bars scaled to the best day; about seven days labelled."""
    plot_w = CHART_WIDTH - CHART_LEFT - CHART_RIGHT
    plot_h = CHART_HEIGHT - CHART_TOP - CHART_BOTTOM
    base = CHART_TOP + plot_h
    peak = max((d.revenue_micro for d in days), default=0)
    step = plot_w / max(len(days), 1)
    bars, labels = [], []
    every = max(1, round(len(days) / 7))
    for i, day in enumerate(days):
        height = plot_h * max(day.revenue_micro, 0) / peak if peak > 0 else 0.0
        x = CHART_LEFT + i * step
        bars.append(
            Bar(
                x=round(x + step * 0.15, 2),
                y=round(base - height, 2),
                width=round(max(step * 0.7, 1.0), 2),
                height=round(height, 2),
                title=f"{day.day}: {day.revenue}, {day.gpu_hours:g} GPU-hours",
            )
        )
        last = i == len(days) - 1 and i % every >= max(2, every // 2)
        if i % every == 0 or last:
            labels.append(AxisLabel(round(x + step / 2, 2), day.day.strftime("%m-%d")))
    return Chart(
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        left=CHART_LEFT,
        top=CHART_TOP,
        base=base,
        bars=bars,
        labels=labels,
        top_label=format_credits(peak, symbol, 2),
    )


@dataclass(frozen=True)
class LedgerPage:
    """One page of the period's bill lines, newest first; links keep the chosen period."""

    number: int
    lines: list[BillLinePublic]
    newer_url: str | None
    older_url: str | None


class CapsForm(FormBody):
    """Your own spending caps as typed: amounts like 12.50, empty for no cap."""

    model_config = ConfigDict(str_max_length=40)

    max_hourly: str = ""
    monthly_budget: str = ""
    low_balance: str = ""


@dataclass(frozen=True)
class CapsView:
    max_hourly: str
    monthly_budget: str
    low_balance: str
    admin_max_hourly: str | None
    admin_monthly_budget: str | None
    hourly_spend: str
    month_spend: str
    typed: CapsForm
    """What the caps form shows: the caps as plain amounts, or what was typed if refused."""


@dataclass(frozen=True)
class PlanText:
    """How the console words a plan: its option on the create form, its rule on Billing."""

    name: str
    title: str
    option: str
    rule: str


@dataclass(frozen=True)
class WindowView:
    id: int
    days: str
    start: str
    end: str
    discount: str
    tz: str


@dataclass(frozen=True)
class BillingView:
    balance: str
    balance_ncu: str
    start: str
    end: str
    tz: str
    statement: StatementPublic | None
    revenue: RevenuePublic | None
    chart: Chart | None
    csv_url: str
    revenue_csv_url: str
    ledger: LedgerPage
    caps: CapsView
    plans: list[PlanText]
    windows: list[WindowView]


LEDGER_PAGE = 25
MAX_LEDGER_PAGE = 100_000
PLAN_TEXTS = (
    PlanText(
        plans.ON_DEMAND,
        "On demand",
        "On demand: per second at the hourly price",
        "Billed per second at the model's hourly price while the instance holds its GPUs; "
        "off-peak windows discount it. Stop it and billing stops.",
    ),
    PlanText(
        plans.SPOT,
        "Spot",
        "Spot: cheaper per second, may be interrupted",
        "Billed per second at the lower spot price (off-peak discounts too), but the "
        "instance may be stopped when the GPUs are needed; its workspace is kept.",
    ),
    PlanText(
        plans.DAILY,
        "Daily",
        "Daily: a prepaid 24-hour block, GPUs reserved for you",
        "A prepaid 24-hour block, cheaper than 24 h on demand; the GPUs stay reserved for "
        "you for the whole block, even while stopped. Unused time is not refunded.",
    ),
)


def _money(micro: int | None, symbol: str) -> str:
    return format_cap(micro, symbol)


def _plain(micro: int | None) -> str:
    """An amount as the caps form takes it back: '12.50', or '' for no cap."""
    return format_cap(micro, "", unset="")


def caps_view(
    session: Session, user_id: int, symbol: str, typed: CapsForm | None = None
) -> CapsView:
    caps = limits.caps_of(session, user_id)
    return CapsView(
        max_hourly=_money(caps.max_hourly_micro, symbol),
        monthly_budget=_money(caps.monthly_budget_micro, symbol),
        low_balance=_money(caps.low_balance_micro, symbol),
        admin_max_hourly=None
        if caps.admin_max_hourly_micro is None
        else format_credits(caps.admin_max_hourly_micro, symbol, 2),
        admin_monthly_budget=None
        if caps.admin_monthly_budget_micro is None
        else format_credits(caps.admin_monthly_budget_micro, symbol, 2),
        hourly_spend=format_credits(limits.hourly_spend(session, user_id), symbol),
        month_spend=format_credits(limits.month_spend(session, user_id, utcnow()), symbol),
        typed=typed
        or CapsForm(
            max_hourly=_plain(caps.max_hourly_micro),
            monthly_budget=_plain(caps.monthly_budget_micro),
            low_balance=_plain(caps.low_balance_micro),
        ),
    )


def ledger_page(
    session: Session,
    user_id: int,
    number: int,
    catalog: Catalog,
    period: statements.Period,
    query: dict[str, str],
) -> LedgerPage:
    """One page of the period's bill: the wallet's movements, charges grouped by session
    and day."""
    lines = bill_lines.user_bill(session, user_id, period, catalog.currency_symbol)
    found = lines[(number - 1) * LEDGER_PAGE : number * LEDGER_PAGE + 1]

    def url(n: int) -> str:
        return "/billing?" + urlencode({**query, "page": n}) + "#ledger"

    return LedgerPage(
        number=number,
        lines=found[:LEDGER_PAGE],
        newer_url=url(number - 1) if number > 1 else None,
        older_url=url(number + 1) if len(found) > LEDGER_PAGE else None,
    )


def windows_view(session: Session) -> list[WindowView]:
    return [
        WindowView(
            id=window_id,
            days="every day"
            if len(w.weekdays) == 7
            else ", ".join(WEEKDAYS[d] for d in sorted(w.weekdays)),
            start=f"{w.start_minute // 60:02d}:{w.start_minute % 60:02d}",
            end=f"{w.end_minute // 60:02d}:{w.end_minute % 60:02d}",
            discount=f"{format_discount(w.discount_bp)} %",
            tz=w.tz,
        )
        for window_id, w in offpeak.list_windows(session)
    ]


PageQuery = Annotated[int, Query(ge=1, le=MAX_LEDGER_PAGE)]


def _billing_page(
    console: ConsolePage,
    *,
    start: str | None,
    to: str | None,
    page: int = 1,
    typed_caps: CapsForm | None = None,
    refusal: GpuleaseError | None = None,
    notice: str = "",
) -> Response:
    rt = console.runtime
    session, user = console.session, console.user
    catalog = rt.catalog
    symbol = catalog.currency_symbol
    error, status = (refusal.message, refusal.status) if refusal else ("", 200)
    micro = ledger.balance(session, user.id)
    statement = revenue = None
    try:
        period = statements.parse_period(start, to, rt.settings.timezone)
    except InvalidInput as exc:
        error, status = exc.message, exc.status
        period = statements.parse_period(None, None, rt.settings.timezone)
    else:
        statement = statements.user_statement(session, user, period, catalog)
        if console.is_admin:
            revenue = statements.revenue(session, period, catalog)
    period_query = {"from": str(period.start), "to": str(period.end)}
    query = urlencode(period_query)
    view = BillingView(
        balance=format_credits(micro, symbol),
        balance_ncu=f"{ncu(micro, catalog.ncu_reference_hourly_micro):.4f}",
        start=start if error and start else str(period.start),
        end=to if error and to else str(period.end),
        tz=period.tz,
        statement=statement,
        revenue=revenue,
        chart=revenue_chart(revenue.by_day, symbol) if revenue else None,
        csv_url=f"/api/v1/statement.csv?{query}",
        revenue_csv_url=f"/api/v1/admin/revenue.csv?{query}",
        ledger=ledger_page(session, user.id, page, catalog, period, period_query),
        caps=caps_view(session, user.id, symbol, typed_caps),
        plans=list(PLAN_TEXTS),
        windows=windows_view(session),
    )
    context = {"view": view, "error": error, "notice": notice}
    return console.render("billing/page.html", context, page="billing", status_code=status)


@router.get("/billing")
def billing(
    console: PageViewer,
    start: FromQuery = None,
    to: DateQuery = None,
    page: PageQuery = 1,
    saved: str = "",
) -> Response:
    notice = "Saved your spending caps." if saved == "caps" else ""
    return _billing_page(console, start=start, to=to, page=page, notice=notice)


@router.post("/billing/caps")
def set_caps(console: FormViewer, typed: Annotated[CapsForm, Form()]) -> Response:
    """Your own caps (empty: none), through the same service as PUT /api/v1/limits."""

    def act() -> str:
        limits.set_user_caps(
            console.session,
            console.user.id,
            utcnow(),
            max_hourly_micro=credits(typed.max_hourly, "max hourly spend"),
            monthly_budget_micro=credits(typed.monthly_budget, "monthly budget"),
            low_balance_micro=credits(typed.low_balance, "low-balance threshold"),
            symbol=console.runtime.catalog.currency_symbol,
        )
        return "/billing?saved=caps#caps"

    return console.act(
        act,
        lambda exc: _billing_page(console, start=None, to=None, typed_caps=typed, refusal=exc),
    )
