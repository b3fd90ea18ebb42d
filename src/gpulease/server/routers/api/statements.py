"""Statements of the caller's usage, and the operator's revenue, as JSON or CSV."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from gpulease.schemas.statements import RevenuePublic, StatementPublic
from gpulease.server.routers.deps import current_admin, current_user, runtime, tx
from gpulease.server.services import statements

router = APIRouter(tags=["statements"])

From = Annotated[str | None, Query(alias="from", max_length=32)]
To = Annotated[str | None, Query(alias="to", max_length=32)]
Tz = Annotated[str | None, Query(max_length=64)]


def _period(
    request: Request, start: str | None, end: str | None, tz: str | None
) -> statements.Period:
    """Dates as typed; the zone defaults to the operator's (GPULEASE_TIMEZONE)."""
    return statements.parse_period(start, end, tz or runtime(request).settings.timezone)


def _statement(
    request: Request, start: str | None, end: str | None, tz: str | None
) -> StatementPublic:
    with tx(request) as session:
        user = current_user(session, request)
        period = _period(request, start, end, tz)
        return statements.user_statement(session, user, period, runtime(request).catalog)


def _revenue(request: Request, start: str | None, end: str | None, tz: str | None) -> RevenuePublic:
    with tx(request) as session:
        current_admin(session, request)
        period = _period(request, start, end, tz)
        return statements.revenue(session, period, runtime(request).catalog)


def _csv(body: str, filename: str) -> Response:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", filename)
    return Response(
        body,
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{safe}"'},
    )


@router.get("/statement")
def statement(
    request: Request, start: From = None, end: To = None, tz: Tz = None
) -> StatementPublic:
    """Your usage in a period (default: this month): by instance, day, GPU model and kind."""
    return _statement(request, start, end, tz)


@router.get("/statement.csv", response_class=Response)
def statement_csv(request: Request, start: From = None, end: To = None, tz: Tz = None) -> Response:
    found = _statement(request, start, end, tz)
    name = f"gpulease-statement-{found.user}-{found.start}-{found.end}.csv"
    return _csv(statements.statement_csv(found), name)


@router.get("/admin/revenue")
def revenue(request: Request, start: From = None, end: To = None, tz: Tz = None) -> RevenuePublic:
    """Revenue and GPU-hours sold per GPU model per day (admins only)."""
    return _revenue(request, start, end, tz)


@router.get("/admin/revenue.csv", response_class=Response)
def revenue_csv(request: Request, start: From = None, end: To = None, tz: Tz = None) -> Response:
    found = _revenue(request, start, end, tz)
    return _csv(statements.revenue_csv(found), f"gpulease-revenue-{found.start}-{found.end}.csv")
