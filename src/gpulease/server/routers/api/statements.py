"""Statements of the caller's usage, and the operator's revenue, as JSON or CSV."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from gpulease.schemas.statements import RevenuePublic, StatementPublic
from gpulease.server.routers.api.clock import Now
from gpulease.server.routers.deps import AdminUser, CurrentUser, SessionDep, runtime
from gpulease.server.services import statements

router = APIRouter(tags=["statements"])

From = Annotated[str | None, Query(alias="from", max_length=32)]
To = Annotated[str | None, Query(alias="to", max_length=32)]
Tz = Annotated[str | None, Query(max_length=64)]


def _period(
    request: Request, now: Now, start: From = None, end: To = None, tz: Tz = None
) -> statements.Period:
    """?from=&to=&tz= as typed, as of now (the default period is this month); the zone
    defaults to the operator's (GPULEASE_TIMEZONE)."""
    zone = tz or runtime(request).settings.timezone
    return statements.parse_period(start, end, zone, now=now)


PeriodQuery = Annotated[statements.Period, Depends(_period)]


def _csv(body: str, filename: str) -> Response:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", filename)
    return Response(
        body,
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{safe}"'},
    )


@router.get("/statement")
def statement(
    session: SessionDep, user: CurrentUser, period: PeriodQuery, request: Request
) -> StatementPublic:
    """Your usage in a period (default: this month): by instance, day, GPU model and kind."""
    return statements.user_statement(session, user, period, runtime(request).catalog)


@router.get("/statement.csv", response_class=Response)
def statement_csv(
    session: SessionDep, user: CurrentUser, period: PeriodQuery, request: Request
) -> Response:
    found = statement(session, user, period, request)
    name = f"gpulease-statement-{found.user}-{found.start}-{found.end}.csv"
    return _csv(statements.statement_csv(found), name)


@router.get("/admin/revenue")
def revenue(
    session: SessionDep, _: AdminUser, period: PeriodQuery, request: Request
) -> RevenuePublic:
    """Revenue and GPU-hours sold per GPU model per day (admins only)."""
    return statements.revenue(session, period, runtime(request).catalog)


@router.get("/admin/revenue.csv", response_class=Response)
def revenue_csv(
    session: SessionDep, admin: AdminUser, period: PeriodQuery, request: Request
) -> Response:
    found = revenue(session, admin, period, request)
    return _csv(statements.revenue_csv(found), f"gpulease-revenue-{found.start}-{found.end}.csv")
