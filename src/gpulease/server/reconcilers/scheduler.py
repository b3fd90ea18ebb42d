"""Place queued instances on free GPUs, first come first served per GPU model.

Before the FIFO pass: a daily-plan instance whose paid block still reserves its GPUs starts
on them at once, and instances that asked to start only when cheap wait outside the queue
until an off-peak window opens. A daily instance buys its block when it is placed.
"""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gpulease.core.errors import PaymentRequired
from gpulease.scheduler.fifo import FreeGpu, Request, place_fifo
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Gpu, Instance, Node
from gpulease.server.runtime import Runtime
from gpulease.server.services import ledger, notifications, templates
from gpulease.server.services.billing import offpeak, plans
from gpulease.server.services.instances.lifecycle import current_queue
from gpulease.server.services.instances.states import QUEUED, STARTING, STOPPED, switch_status

WAITING_FOR_CHEAP = "waiting for an off-peak window (start when cheap)"


def tick(rt: Runtime) -> int:
    """One scheduling pass. Returns how many instances were placed."""
    placed = 0
    with transaction(rt.sessions) as session:
        placed += _start_reserved(session)
        queue = _eligible(session, current_queue(session))
        # only nodes whose driver runs each instance's template (services/templates)
        queue, refused = templates.restrict_queue(session, queue)
        for instance_id, reason in refused.items():
            refused_instance = session.get(Instance, instance_id)
            if refused_instance is not None and refused_instance.status == QUEUED:
                _refuse(session, refused_instance, reason)
        if not queue:
            return placed
        free = [
            FreeGpu(g.node_id, g.id, g.index, g.model or "")
            for g in session.scalars(
                select(Gpu)
                .join(Node, Node.id == Gpu.node_id)
                .where(
                    Gpu.instance_id.is_(None),
                    Gpu.present.is_(True),
                    Gpu.model.is_not(None),
                    Node.status == "ready",
                )
            )
        ]
        node_ids = list(session.scalars(select(Node.id).where(Node.status == "ready")))
        for placement in place_fifo(queue, free, node_ids):
            instance = session.get(Instance, placement.instance_id)
            if instance is None or instance.status != QUEUED:
                continue
            if (
                instance.plan != plans.DAILY
                and ledger.balance(session, instance.owner_id, instance.team_id) <= 0
            ):
                _refuse(session, instance, "not started: the wallet's balance is zero")
                continue
            with session.begin_nested() as nested:
                taken = session.execute(
                    update(Gpu)
                    .where(Gpu.id.in_(placement.gpu_ids), Gpu.instance_id.is_(None))
                    .values(instance_id=instance.id)
                    .execution_options(synchronize_session=False)
                ).rowcount  # type: ignore[attr-defined]
                if taken != len(placement.gpu_ids):
                    nested.rollback()  # another replica took one of them; next tick
                    continue
                if instance.plan == plans.DAILY:
                    try:
                        plans.buy_block(session, instance, rt.catalog, utcnow())
                    except PaymentRequired as exc:
                        nested.rollback()
                        _refuse(session, instance, f"not started: {exc.message}")
                        continue
                instance.node_id = placement.node_id
                switch_status(session, instance, STARTING, "")
                placed += 1
    return placed


def _eligible(session: Session, queue: list[Request]) -> list[Request]:
    """The queue less instances waiting for an off-peak window (they do not hold it up)."""
    waiting = set(
        session.scalars(
            select(Instance.id).where(
                Instance.status == QUEUED, Instance.start_when_cheap.is_(True)
            )
        )
    )
    if not waiting:
        return queue
    cheap = offpeak.is_cheap_now(session)
    for instance_id in waiting:
        instance = session.get(Instance, instance_id)
        assert instance is not None
        instance.status_message = "" if cheap else WAITING_FOR_CHEAP
    return queue if cheap else [r for r in queue if r.instance_id not in waiting]


def _start_reserved(session: Session) -> int:
    """Queued daily instances whose block still reserves their GPUs: start them there."""
    now = utcnow()
    started = 0
    for instance in session.scalars(
        select(Instance).where(
            Instance.status == QUEUED,
            Instance.plan == plans.DAILY,
            Instance.reserved_until > now,
        )
    ).all():
        held = session.scalar(select(func.count(Gpu.id)).where(Gpu.instance_id == instance.id))
        if held == instance.gpu_count and (instance.node_id is not None or held == 0):
            switch_status(session, instance, STARTING, "")
            started += 1
    return started


def _refuse(session: Session, instance: Instance, reason: str) -> None:
    instance.desired_state = "stopped"
    switch_status(session, instance, STOPPED, reason)
    notifications.notify(session, instance.owner_id, "instance_stopped", reason)
