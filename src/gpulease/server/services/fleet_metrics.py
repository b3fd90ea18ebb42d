"""The figures Prometheus scrapes, read from the database: instances by state, the queue,
GPUs present, and the credits billed so far (GPU readings: services.metrics)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpulease.server.orm import (
    Gpu,
    Instance,
    LedgerAccount,
    LedgerEntry,
    LedgerTransaction,
)
from gpulease.server.services import ledger
from gpulease.server.services.instances.states import ALL_STATES, QUEUED


def instances_by_state(session: Session) -> dict[str, int]:
    """Every state, with 0 for those no instance is in (a series should not vanish)."""
    counts = dict(
        session.execute(
            select(Instance.status, func.count(Instance.id)).group_by(Instance.status)
        ).all()
    )
    return {state: int(counts.get(state, 0)) for state in ALL_STATES} | {
        state: int(n) for state, n in counts.items() if state not in ALL_STATES
    }


def queue_length(session: Session) -> int:
    return int(
        session.scalar(select(func.count(Instance.id)).where(Instance.status == QUEUED)) or 0
    )


def billed_by_kind(session: Session) -> dict[str, int]:
    """Micro-credits credited to the revenue account since the start, by transaction kind
    (usage, daily_block, storage): what renters have been billed. Only grows."""
    rows = session.execute(
        select(LedgerTransaction.kind, func.sum(LedgerEntry.amount))
        .join(LedgerEntry, LedgerEntry.transaction_id == LedgerTransaction.id)
        .join(LedgerAccount, LedgerAccount.id == LedgerEntry.account_id)
        .where(LedgerAccount.kind == ledger.REVENUE)
        .group_by(LedgerTransaction.kind)
    )
    return {str(kind): int(total or 0) for kind, total in rows}


@dataclass(frozen=True)
class GpuCount:
    model: str
    simulated: bool
    held: bool
    count: int


def gpu_counts(session: Session) -> list[GpuCount]:
    """Present GPUs by model, simulated or real, held or free."""
    rows = session.execute(
        select(
            func.coalesce(Gpu.model, Gpu.nvml_name),
            Gpu.simulated,
            Gpu.instance_id.is_not(None),
            func.count(Gpu.id),
        )
        .where(Gpu.present.is_(True))
        .group_by(
            func.coalesce(Gpu.model, Gpu.nvml_name), Gpu.simulated, Gpu.instance_id.is_not(None)
        )
    )
    return [GpuCount(str(m), bool(sim), bool(held), int(n)) for m, sim, held, n in rows]
