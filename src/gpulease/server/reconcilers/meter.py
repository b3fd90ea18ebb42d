"""Charge running instances each second they hold GPUs; stop them when credit runs out."""

from __future__ import annotations

from sqlalchemy import select

from gpulease.core.money import format_credits
from gpulease.server.db import finds_any, transaction
from gpulease.server.orm import Instance
from gpulease.server.runtime import Runtime
from gpulease.server.services import ledger, metering, notifications
from gpulease.server.services.instances.lifecycle import stop_instance
from gpulease.server.services.instances.states import ACTIVE


def tick(rt: Runtime) -> None:
    if not finds_any(rt.sessions, metering.open_ids()):
        return
    with transaction(rt.sessions) as session:
        owners = metering.charge_open_segments(session, min_step_s=rt.settings.billing_step_s)
    for owner_id in sorted(owners):
        with transaction(rt.sessions) as session:
            balance = ledger.balance(session, owner_id)
            if balance > 0:
                continue
            live = session.scalars(
                select(Instance).where(
                    Instance.owner_id == owner_id,
                    Instance.status.in_(ACTIVE),
                )
            ).all()
            if not live:
                continue
            shown = format_credits(balance, rt.catalog.currency_symbol)
            reason = (
                f"stopped: credit exhausted (balance {shown}); your workspace is kept, "
                "top up and start it again"
            )
            for instance in live:
                stop_instance(session, instance, reason)
            notifications.notify(
                session,
                owner_id,
                "credit_exhausted",
                f"your balance reached {shown}: {len(live)} instance(s) stopped, workspaces kept",
            )
