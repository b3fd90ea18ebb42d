"""Place queued instances on free GPUs, first come first served per GPU model."""

from __future__ import annotations

from sqlalchemy import select, update

from gpulease.scheduler.fifo import FreeGpu, place_fifo
from gpulease.server.db import transaction
from gpulease.server.orm import Gpu, Instance, Node
from gpulease.server.runtime import Runtime
from gpulease.server.services import ledger, notifications
from gpulease.server.services.instances.lifecycle import current_queue
from gpulease.server.services.instances.states import QUEUED, STARTING, STOPPED, switch_status


def tick(rt: Runtime) -> int:
    """One scheduling pass. Returns how many instances were placed."""
    placed = 0
    with transaction(rt.sessions) as session:
        queue = current_queue(session)
        if not queue:
            return 0
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
            if ledger.balance(session, instance.owner_id) <= 0:
                instance.desired_state = "stopped"
                reason = "not started: your balance is zero; top up and start it again"
                switch_status(session, instance, STOPPED, reason)
                notifications.notify(session, instance.owner_id, "instance_stopped", reason)
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
                instance.node_id = placement.node_id
                switch_status(session, instance, STARTING, "")
                placed += 1
    return placed
