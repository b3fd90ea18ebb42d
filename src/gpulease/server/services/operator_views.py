"""What the admin console shows: every user with balance and caps, every node with its GPUs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpulease.server.orm import (
    Gpu,
    Instance,
    LedgerAccount,
    LedgerEntry,
    Node,
    SpendingLimit,
    User,
)
from gpulease.server.services import ledger
from gpulease.server.services.billing.limits import LIVE, Caps


@dataclass(frozen=True)
class UserAccount:
    id: int
    name: str
    email: str | None
    role: str
    created_at: datetime
    balance_micro: int
    caps: Caps
    live_instances: int
    hourly_spend_micro: int


def user_accounts(session: Session) -> list[UserAccount]:
    """All users, oldest first, each with balance, caps and what they spend now (4 queries)."""
    balances = dict(
        session.execute(
            select(LedgerAccount.user_id, func.sum(LedgerEntry.amount))
            .join(LedgerEntry, LedgerEntry.account_id == LedgerAccount.id)
            .where(LedgerAccount.kind == ledger.WALLET)
            .group_by(LedgerAccount.user_id)
        ).all()
    )
    caps = {row.user_id: row for row in session.scalars(select(SpendingLimit))}
    live = {
        owner: (int(n), int(spend or 0))
        for owner, n, spend in session.execute(
            select(Instance.owner_id, func.count(Instance.id), func.sum(Instance.hourly_micro))
            .where(Instance.status.in_(LIVE))
            .group_by(Instance.owner_id)
        )
    }
    accounts = []
    for user in session.scalars(select(User).order_by(User.id)):
        row = caps.get(user.id)
        n_live, spend = live.get(user.id, (0, 0))
        accounts.append(
            UserAccount(
                id=user.id,
                name=user.name,
                email=user.email,
                role=user.role,
                created_at=user.created_at,
                balance_micro=int(balances.get(user.id) or 0),
                caps=Caps(
                    row.max_hourly_micro,
                    row.monthly_budget_micro,
                    row.admin_max_hourly_micro,
                    row.admin_monthly_budget_micro,
                    row.low_balance_micro,
                )
                if row
                else Caps(None, None, None, None, None),
                live_instances=n_live,
                hourly_spend_micro=spend,
            )
        )
    return accounts


@dataclass(frozen=True)
class GpuSlot:
    index: int
    uuid: str
    model: str | None
    nvml_name: str
    memory_mb: int
    simulated: bool
    instance_id: int | None
    holder: str | None
    """'owner/instance' of the instance holding this GPU; None when free."""


@dataclass(frozen=True)
class NodeView:
    id: int
    name: str
    backend: str
    hostname: str
    status: str
    driver_version: str | None
    cuda_version: str | None
    cpu_count: int
    memory_mb: int
    last_seen_at: datetime
    gpus: list[GpuSlot]

    @property
    def held(self) -> int:
        return sum(1 for g in self.gpus if g.instance_id is not None)


def fleet(session: Session) -> list[NodeView]:
    """Nodes with their present GPUs and who holds each one."""
    holders = {
        instance_id: f"{owner}/{name}"
        for instance_id, owner, name in session.execute(
            select(Instance.id, User.name, Instance.name)
            .join(User, User.id == Instance.owner_id)
            .join(Gpu, Gpu.instance_id == Instance.id)
        )
    }
    gpus: dict[int, list[GpuSlot]] = {}
    for g in session.scalars(
        select(Gpu).where(Gpu.present.is_(True)).order_by(Gpu.node_id, Gpu.index)
    ):
        gpus.setdefault(g.node_id, []).append(
            GpuSlot(
                index=g.index,
                uuid=g.uuid,
                model=g.model,
                nvml_name=g.nvml_name,
                memory_mb=g.memory_mb,
                simulated=g.simulated,
                instance_id=g.instance_id,
                holder=holders.get(g.instance_id) if g.instance_id is not None else None,
            )
        )
    return [
        NodeView(
            id=n.id,
            name=n.name,
            backend=n.backend,
            hostname=n.hostname,
            status=n.status,
            driver_version=n.driver_version,
            cuda_version=n.cuda_version,
            cpu_count=n.cpu_count,
            memory_mb=n.memory_mb,
            last_seen_at=n.last_seen_at,
            gpus=gpus.get(n.id, []),
        )
        for n in session.scalars(select(Node).order_by(Node.id))
    ]
