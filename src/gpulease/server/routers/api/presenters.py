"""Rows to public schemas, where a schema needs more than the row's own attributes."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog
from gpulease.core.money import format_credits, ncu
from gpulease.core.records import from_attributes
from gpulease.schemas.instances import InstancePublic
from gpulease.schemas.ledger import Balance, LedgerLine
from gpulease.server.orm import Instance, InstanceDataset, LedgerTransaction
from gpulease.server.services.instances import queue


def instance_public(
    session: Session, instance: Instance, catalog: Catalog, positions: dict[int, int]
) -> InstancePublic:
    gpus = instance.gpus
    return from_attributes(
        InstancePublic,
        instance,
        gpu_indices=[g.index for g in gpus],
        simulated=any(g.simulated for g in gpus),
        node=instance.node.name if instance.node else None,
        last_node=instance.last_node.name if instance.last_node else None,
        workspace_saved_at=instance.workspace_snapshot_at,
        hourly=format_credits(instance.hourly_micro, catalog.currency_symbol),
        queue_position=positions.get(instance.id),
        **queue_fields(instance),
        team=team.name if (team := instance.team) is not None else None,
        datasets={
            row.name: row.version
            for row in session.execute(
                select(InstanceDataset.name, InstanceDataset.version)
                .where(InstanceDataset.instance_id == instance.id)
                .order_by(InstanceDataset.name)
            )
        },
    )


def queue_fields(instance: Instance) -> dict[str, object]:
    """The scheduler's word, for a queued instance only (a stale one is not shown)."""
    queued = instance.status == "queued"
    return {
        "queue_reason": instance.queue_reason or None if queued else None,
        "queue_eta": instance.queue_eta if queued else None,
        "queue_eta_basis": instance.queue_eta_basis or None if queued else None,
        "duration_basis": queue.duration_basis(instance),
    }


def balance_public(micro: int, catalog: Catalog) -> Balance:
    return Balance(
        balance_micro=micro,
        balance=format_credits(micro, catalog.currency_symbol),
        currency=catalog.currency_name,
        ncu=f"{ncu(micro, catalog.ncu_reference_hourly_micro):.4f}",
    )


def ledger_line(txn: LedgerTransaction, amount: int, catalog: Catalog) -> LedgerLine:
    return from_attributes(
        LedgerLine,
        txn,
        amount_micro=amount,
        amount=format_credits(amount, catalog.currency_symbol),
    )
