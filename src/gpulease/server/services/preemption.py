"""Spot preemption: stop a spot instance with notice and a grace period, queue it again.

The scheduler decides which spot instances go (scheduler/policy.py: the youngest first,
never an on-demand or daily one); this module carries it out. A preempted instance goes to
stopping at once and its usage segment closes then, so the grace its job gets to checkpoint
is never billed; its runner is told the grace (runner/preempt.py writes the job's notice and
sends SIGTERM). Once it has stopped, with its workspace kept, it is queued again and the
runs the preemption interrupted are queued on it again, to resume from their checkpoints.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.server.db import utcnow
from gpulease.server.orm import Instance, Run
from gpulease.server.services import metering, notifications
from gpulease.server.services.billing import plans
from gpulease.server.services.instances.states import (
    QUEUED,
    RUNNING,
    STARTING,
    STOPPED,
    STOPPING,
    switch_status,
)

PREEMPTED = "preempted: its GPUs went to an on-demand or daily instance"


def preempt(session: Session, instance: Instance, now: datetime, grace_s: float) -> bool:
    """Tell a live spot instance to stop for preemption; False (nothing done) for any other.
    Billing ends now: the segment closes before the grace starts."""
    if instance.plan != plans.SPOT or instance.status not in (STARTING, RUNNING):
        return False
    if instance.desired_state != "running":
        return False  # its owner is stopping or releasing it anyway
    instance.preempted_at = now
    metering.close_segment(session, instance, now)
    switch_status(session, instance, STOPPING, PREEMPTED)
    notifications.notify(
        session,
        instance.owner_id,
        "instance_stopped",
        f"spot instance {instance.name} was preempted: its job has {grace_s:.0f} s to "
        "checkpoint (gpulease.track.preempted()); it is queued again and resumes when GPUs "
        "free up",
    )
    return True


def notice_grace(instance: Instance, grace_s: float) -> float | None:
    """What a runner is told with its stop: the grace its jobs get after the notice, or None
    for an ordinary stop."""
    if instance.status == STOPPING and instance.preempted_at is not None:
        return grace_s
    return None


def requeue_stopped(session: Session) -> list[Instance]:
    """Queue again every preempted instance that has stopped (its owner still wants it
    running), with the runs the preemption interrupted queued on it again."""
    out = []
    for instance in session.scalars(
        select(Instance).where(Instance.status == STOPPED, Instance.preempted_at.is_not(None))
    ).all():
        at = instance.preempted_at
        assert at is not None
        instance.preempted_at = None
        if instance.desired_state != "running":
            continue
        interrupted = _interrupted_runs(session, instance, at)
        switch_status(session, instance, QUEUED, "preempted; queued again")
        instance.status_message = "preempted; queued again to resume when GPUs free up"
        for run in interrupted:
            again = Run(
                instance_id=instance.id,
                owner_id=run.owner_id,
                command=run.command,
                task_name=run.task_name,
                env=dict(run.env),
                status="pending",
                stop_instance_on_exit=run.stop_instance_on_exit,
                created_at=utcnow(),
            )
            session.add(again)
            session.flush()
            if instance.stop_after_run_id == run.id:
                instance.stop_after_run_id = again.id
        out.append(instance)
    return out


def _interrupted_runs(session: Session, instance: Instance, at: datetime) -> list[Run]:
    """Runs that were running (or about to) when the instance was preempted: those that
    had not finished by then. One that ended on its own before the notice is not among
    them; one that exited in the grace (after its checkpoint, with any code) is."""
    return list(
        session.scalars(
            select(Run)
            .where(
                Run.instance_id == instance.id,
                Run.created_at <= at,
                (Run.finished_at.is_(None)) | (Run.finished_at >= at),
            )
            .order_by(Run.id)
        )
    )
