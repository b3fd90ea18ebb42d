"""The one door for an instance's status: every change goes through switch_status.

queued → starting → running → stopping → stopped → released, and failed from any live
state. Entering a state has its side effects here and nowhere else: GPUs are freed when an
instance stops holding them, the usage segment opens on running and closes when the GPUs
are freed, pending runs end when the instance can no longer run them.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpulease.core.errors import Conflict
from gpulease.server.db import utcnow
from gpulease.server.orm import Gpu, Instance, Run
from gpulease.server.runner_doorbell import ring_after_commit
from gpulease.server.services import metering
from gpulease.server.services.billing import plans

QUEUED, STARTING, RUNNING, STOPPING, STOPPED, RELEASED, FAILED = (
    "queued",
    "starting",
    "running",
    "stopping",
    "stopped",
    "released",
    "failed",
)
ALL_STATES = (QUEUED, STARTING, RUNNING, STOPPING, STOPPED, RELEASED, FAILED)
LIVE = (STARTING, RUNNING, STOPPING)
HOLDS_GPUS = LIVE
# Asked to run and not yet asked to stop: what a stop acts on and what a new run may join.
ACTIVE = (QUEUED, STARTING, RUNNING)
# Down but kept: what a start (queued again) acts on.
RESTARTABLE = (STOPPED, FAILED)

TRANSITIONS: dict[str, set[str]] = {
    QUEUED: {STARTING, STOPPED, RELEASED, FAILED},
    STARTING: {RUNNING, STOPPING, STOPPED, FAILED},
    RUNNING: {STOPPING, STOPPED, FAILED},
    STOPPING: {STOPPED, FAILED},
    STOPPED: {QUEUED, RELEASED},
    FAILED: {QUEUED, RELEASED},
    RELEASED: set(),
}


def switch_status(
    session: Session,
    instance: Instance,
    new: str,
    reason: str = "",
    *,
    at: datetime | None = None,
) -> None:
    """Move instance to `new`, or raise Conflict if that move is not allowed from where it is.

    The UPDATE is guarded by the old status, so two replicas racing to move the same
    instance cannot both win. `at` is when it really happened (a dead runner's last
    heartbeat, say): usage is billed up to then.
    """
    old = instance.status
    if new not in TRANSITIONS[old]:
        raise Conflict(f"instance {instance.name} is {old}; it cannot go to {new} from there")
    now = utcnow()
    result = session.execute(
        update(Instance)
        .where(Instance.id == instance.id, Instance.status == old)
        .values(status=new, status_reason=reason, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        session.refresh(instance)
        raise Conflict(f"instance {instance.name} changed meanwhile; it is now {instance.status}")
    instance.status = new
    instance.status_reason = reason
    instance.updated_at = now

    if new == QUEUED:
        instance.queued_at = now
        instance.status_message = ""
    elif new == RUNNING:
        instance.started_at = now
        instance.status_message = ""
        metering.open_segment(session, instance, now)
    elif new == STOPPING:
        instance.stop_requested_at = now
    if new in (RUNNING, STOPPING):  # its runner's long poll lists the runs, or the stop
        ring_after_commit(session, instance.id)
    if new in (STOPPED, FAILED, RELEASED) and old in HOLDS_GPUS:
        metering.close_segment(session, instance, at or now)
        instance.runner_token_hash = None
        instance.runner_handle = None
        instance.runner_launched_at = None
        instance.stop_requested_at = None
        instance.workspace_saving_since = None
        instance.last_heartbeat_at = None
        instance.status_message = ""
    if new in (STOPPED, FAILED):
        instance.stopped_at = now
        # a paid daily block keeps its GPUs reserved while stopped; release gives them up
        if old in HOLDS_GPUS and not plans.holds_reservation(instance, now):
            free_gpus(session, instance)
    elif new == RELEASED:
        free_gpus(session, instance)
    if new in (STOPPED, FAILED, RELEASED, QUEUED):
        _end_unfinished_runs(session, instance, reason or f"the instance went {new}")


def free_gpus(session: Session, instance: Instance) -> None:
    """Give the instance's GPUs back to the pool (also a daily reservation's, at its end)."""
    session.execute(
        update(Gpu)
        .where(Gpu.instance_id == instance.id)
        .values(instance_id=None)
        .execution_options(synchronize_session=False)
    )
    instance.node_id = None
    session.expire(instance, ["gpus"])


def _end_unfinished_runs(session: Session, instance: Instance, reason: str) -> None:
    now = utcnow()
    for run in session.scalars(
        select(Run).where(Run.instance_id == instance.id, Run.status.in_(("pending", "running")))
    ):
        run.status = "failed"
        run.status_reason = reason
        run.finished_at = now
