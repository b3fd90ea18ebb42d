"""The console's Billing page: balance, the statement of a period, and revenue for admins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse

from gpulease.core.errors import InvalidInput
from gpulease.core.money import format_credits, ncu
from gpulease.server.routers.deps import runtime, tx
from gpulease.server.routers.ui.guards import login_url, viewer
from gpulease.server.routers.ui.templating import render
from gpulease.server.schemas import RevenueDay, RevenuePublic, StatementPublic, UserPublic
from gpulease.server.services import ledger, statements

router = APIRouter()

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


@router.get("/billing")
def billing(request: Request, start: FromQuery = None, to: DateQuery = None) -> Response:
    rt = runtime(request)
    catalog = rt.catalog
    with tx(request) as session:
        user = viewer(session, request)
        if user is None:
            return RedirectResponse(login_url(request), status_code=303)
        public = UserPublic.model_validate(user)
        micro = ledger.balance(session, user.id)
        error, status = "", 200
        statement = revenue = None
        try:
            period = statements.parse_period(start, to, rt.settings.timezone)
        except InvalidInput as exc:
            error, status = exc.message, exc.status
            period = statements.parse_period(None, None, rt.settings.timezone)
        else:
            statement = statements.user_statement(session, user, period, catalog)
            if user.role == "admin":
                revenue = statements.revenue(session, period, catalog)
    query = urlencode({"from": str(period.start), "to": str(period.end)})
    view = BillingView(
        balance=format_credits(micro, catalog.currency_symbol),
        balance_ncu=f"{ncu(micro, catalog.ncu_reference_hourly_micro):.4f}",
        start=start if error and start else str(period.start),
        end=to if error and to else str(period.end),
        tz=period.tz,
        statement=statement,
        revenue=revenue,
        chart=revenue_chart(revenue.by_day, catalog.currency_symbol) if revenue else None,
        csv_url=f"/api/v1/statement.csv?{query}",
        revenue_csv_url=f"/api/v1/admin/revenue.csv?{query}",
    )
    context = {"view": view, "error": error}
    return render(
        request, "billing/page.html", context, user=public, page="billing", status_code=status
    )
