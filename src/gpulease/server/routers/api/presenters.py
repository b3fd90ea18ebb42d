"""Rows to public schemas, where a schema needs more than model_validate."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog
from gpulease.core.money import format_credits, ncu
from gpulease.schemas.instances import InstancePublic
from gpulease.schemas.ledger import Balance, LedgerLine
from gpulease.server.orm import Instance, InstanceDataset, LedgerTransaction


def instance_public(
    session: Session, instance: Instance, catalog: Catalog, positions: dict[int, int]
) -> InstancePublic:
    gpus = instance.gpus
    return InstancePublic(
        id=instance.id,
        name=instance.name,
        status=instance.status,
        desired_state=instance.desired_state,
        status_reason=instance.status_reason,
        status_message=instance.status_message,
        gpu_model=instance.gpu_model,
        gpu_count=instance.gpu_count,
        gpu_indices=[g.index for g in gpus],
        simulated=any(g.simulated for g in gpus),
        template=instance.template,
        node=instance.node.name if instance.node else None,
        hourly_micro=instance.hourly_micro,
        hourly=format_credits(instance.hourly_micro, catalog.currency_symbol),
        queue_position=positions.get(instance.id),
        created_at=instance.created_at,
        started_at=instance.started_at,
        plan=instance.plan,
        team=team.name if (team := instance.team) is not None else None,
        start_when_cheap=instance.start_when_cheap,
        auto_renew=instance.auto_renew,
        reserved_until=instance.reserved_until,
        datasets={
            row.name: row.version
            for row in session.execute(
                select(InstanceDataset.name, InstanceDataset.version)
                .where(InstanceDataset.instance_id == instance.id)
                .order_by(InstanceDataset.name)
            )
        },
    )


def balance_public(micro: int, catalog: Catalog) -> Balance:
    return Balance(
        balance_micro=micro,
        balance=format_credits(micro, catalog.currency_symbol),
        currency=catalog.currency_name,
        ncu=f"{ncu(micro, catalog.ncu_reference_hourly_micro):.4f}",
    )


def ledger_line(txn: LedgerTransaction, amount: int, catalog: Catalog) -> LedgerLine:
    return LedgerLine(
        id=txn.id,
        kind=txn.kind,
        memo=txn.memo,
        amount_micro=amount,
        amount=format_credits(amount, catalog.currency_symbol),
        instance_id=txn.instance_id,
        created_at=txn.created_at,
    )
