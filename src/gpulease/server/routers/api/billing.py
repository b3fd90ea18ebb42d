"""Balance, usage and notifications of the caller."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gpulease.core.money import format_credits, ncu
from gpulease.server.routers.api.presenters import ledger_line
from gpulease.server.routers.deps import current_user, runtime, tx
from gpulease.server.schemas import Balance, NotificationPublic, Usage, UsageSegmentPublic
from gpulease.server.services import ledger, metering, notifications

router = APIRouter(tags=["billing"])


@router.get("/balance")
def balance(request: Request) -> Balance:
    catalog = runtime(request).catalog
    with tx(request) as session:
        user = current_user(session, request)
        micro = ledger.balance(session, user.id)
    return Balance(
        balance_micro=micro,
        balance=format_credits(micro, catalog.currency_symbol),
        currency=catalog.currency_name,
        ncu=f"{ncu(micro, catalog.ncu_reference_hourly_micro):.4f}",
    )


@router.get("/usage")
def usage(request: Request) -> Usage:
    catalog = runtime(request).catalog
    with tx(request) as session:
        user = current_user(session, request)
        return Usage(
            segments=[
                UsageSegmentPublic.model_validate(s)
                for s in metering.list_segments(session, user.id)
            ],
            ledger=[
                ledger_line(txn, amount, catalog)
                for txn, amount in ledger.wallet_entries(session, user.id)
            ],
        )


@router.get("/notifications")
def list_notifications(request: Request) -> list[NotificationPublic]:
    with tx(request) as session:
        user = current_user(session, request)
        return [
            NotificationPublic.model_validate(n) for n in notifications.recent(session, user.id)
        ]
