"""Statements of the caller's usage, and the operator's revenue, as JSON or CSV."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from gpulease.schemas.statements import RevenuePublic, StatementPublic
from gpulease.server.routers.deps import AdminUser, CurrentUser, SessionDep, runtime
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


def _csv(body: str, filename: str) -> Response:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", filename)
    return Response(
        body,
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{safe}"'},
    )


@router.get("/statement")
def statement(
    session: SessionDep,
    user: CurrentUser,
    request: Request,
    start: From = None,
    end: To = None,
    tz: Tz = None,
) -> StatementPublic:
    """Your usage in a period (default: this month): by instance, day, GPU model and kind."""
    period = _period(request, start, end, tz)
    return statements.user_statement(session, user, period, runtime(request).catalog)


@router.get("/statement.csv", response_class=Response)
def statement_csv(
    session: SessionDep,
    user: CurrentUser,
    request: Request,
    start: From = None,
    end: To = None,
    tz: Tz = None,
) -> Response:
    found = statement(session, user, request, start, end, tz)
    name = f"gpulease-statement-{found.user}-{found.start}-{found.end}.csv"
    return _csv(statements.statement_csv(found), name)


@router.get("/admin/revenue")
def revenue(
    session: SessionDep,
    _: AdminUser,
    request: Request,
    start: From = None,
    end: To = None,
    tz: Tz = None,
) -> RevenuePublic:
    """Revenue and GPU-hours sold per GPU model per day (admins only)."""
    period = _period(request, start, end, tz)
    return statements.revenue(session, period, runtime(request).catalog)


@router.get("/admin/revenue.csv", response_class=Response)
def revenue_csv(
    session: SessionDep,
    admin: AdminUser,
    request: Request,
    start: From = None,
    end: To = None,
    tz: Tz = None,
) -> Response:
    found = revenue(session, admin, request, start, end, tz)
    return _csv(statements.revenue_csv(found), f"gpulease-revenue-{found.start}-{found.end}.csv")
