"""What the admin console shows: every user with balance and caps, every node with its GPUs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpulease.core.records import from_attributes
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
from gpulease.server.services.billing.limits import SPENDING, Caps, caps_from


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
            .where(Instance.status.in_(SPENDING))
            .group_by(Instance.owner_id)
        )
    }
    accounts = []
    for user in session.scalars(select(User).order_by(User.id)):
        n_live, spend = live.get(user.id, (0, 0))
        accounts.append(
            from_attributes(
                UserAccount,
                user,
                balance_micro=int(balances.get(user.id) or 0),
                caps=caps_from(caps.get(user.id)),
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
            from_attributes(
                GpuSlot,
                g,
                holder=holders.get(g.instance_id) if g.instance_id is not None else None,
            )
        )
    return [
        from_attributes(NodeView, n, gpus=gpus.get(n.id, []))
        for n in session.scalars(select(Node).order_by(Node.id))
    ]
