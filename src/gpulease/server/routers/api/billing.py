"""Balance, usage and notifications of the caller."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gpulease.schemas.bill import BillLinePublic
from gpulease.schemas.ledger import Balance, Usage, UsageSegmentPublic
from gpulease.schemas.notifications import NotificationPublic
from gpulease.server.routers.api.presenters import balance_public, ledger_line
from gpulease.server.routers.api.statements import PeriodQuery
from gpulease.server.routers.deps import CurrentUser, SessionDep, runtime
from gpulease.server.services import ledger, metering, notifications
from gpulease.server.services.billing import teams
from gpulease.server.services.statements import bill_lines

router = APIRouter(tags=["billing"])


@router.get("/balance")
def balance(
    session: SessionDep, user: CurrentUser, request: Request, team: str | None = None
) -> Balance:
    """Your wallet's balance, or with ?team=NAME the shared wallet of a team you are in."""
    team_id = teams.team_for_member(session, user, team)[0].id if team else None
    return balance_public(ledger.balance(session, user.id, team_id), runtime(request).catalog)


@router.get("/usage")
def usage(session: SessionDep, user: CurrentUser, request: Request) -> Usage:
    catalog = runtime(request).catalog
    return Usage(
        segments=[
            UsageSegmentPublic.model_validate(s) for s in metering.list_segments(session, user.id)
        ],
        ledger=[
            ledger_line(txn, amount, catalog)
            for txn, amount in ledger.wallet_entries(session, user.id)
        ],
    )


@router.get("/bill")
def bill(
    session: SessionDep, user: CurrentUser, period: PeriodQuery, request: Request
) -> list[BillLinePublic]:
    """Your wallet in a period (?from=&to=&tz=, default this month) as a bill, newest first:
    the meter's charges one line per instance session and day, no zero lines."""
    return bill_lines.user_bill(session, user.id, period, runtime(request).catalog.currency_symbol)


@router.get("/notifications")
def list_notifications(session: SessionDep, user: CurrentUser) -> list[NotificationPublic]:
    return [NotificationPublic.model_validate(n) for n in notifications.recent(session, user.id)]
