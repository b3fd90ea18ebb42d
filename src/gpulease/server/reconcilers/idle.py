"""Stop instances that sat idle too long or ran past their maximum runtime (their declared
duration), warning their owners first. What counts as idle: services/instances/autostop."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from gpulease.server.db import batches, readers, transaction, utcnow
from gpulease.server.orm import Instance
from gpulease.server.runtime import Runtime
from gpulease.server.services import notifications
from gpulease.server.services.instances import autostop
from gpulease.server.services.instances.lifecycle import stop_instance
from gpulease.server.services.instances.states import RUNNING


def tick(rt: Runtime, now: datetime | None = None) -> int:
    """One pass over running instances. Returns how many it stopped.

    The instances are looked at first in a read-only transaction (no SQLite write lock
    while every one's samples and runs are read); only those with something to do, a
    warning to give, end or act on, are taken again in a write transaction."""
    now = now or utcnow()
    ceiling = rt.settings.idle_stop_max_minutes
    query = select(Instance).where(Instance.status == RUNNING, Instance.desired_state == "running")
    if ceiling is None:
        query = query.where(
            or_(Instance.idle_minutes.is_not(None), Instance.max_runtime_minutes.is_not(None))
        )
    with transaction(readers(rt.sessions)) as session:
        due = _with_work(session, session.scalars(query).all(), ceiling, now)
    if not due:
        return 0
    stopped = 0
    with transaction(rt.sessions) as session:
        for instance in _taken(session, query, sorted(due)):
            started = instance.started_at or now
            limit = instance.max_runtime_minutes
            if limit is not None and now < started + timedelta(minutes=limit):
                _warn_runtime(session, instance, started, limit, now)
            elif limit is not None:
                reason = (
                    f"it reached its maximum runtime of {autostop.minutes_text(limit)}; "
                    "workspace kept"
                )
                stop_instance(session, instance, reason)
                notifications.notify_once(
                    session,
                    instance.owner_id,
                    "instance_stopped",
                    f"max-runtime:{instance.id}:{started.isoformat()}",
                    f"instance {instance.name} was stopped: {reason}",
                )
                stopped += 1
                continue
            minutes = autostop.effective_idle_minutes(instance, ceiling)
            if minutes is not None and _idle_step(session, instance, minutes, now):
                stopped += 1
    return stopped


def _taken(session: Session, query: Select[Instance], ids: list[int]) -> list[Instance]:
    """The instances of ids that query still finds, locked where the database can, in id
    order (the lists grow with the fleet: one query a slice)."""
    taken: list[Instance] = []
    for batch in batches(ids):
        taken.extend(
            session.scalars(
                query.where(Instance.id.in_(batch))
                .order_by(Instance.id)
                .with_for_update(skip_locked=True)
            ).all()
        )
    return taken


def _with_work(
    session: Session, instances: Sequence[Instance], ceiling: int | None, now: datetime
) -> list[int]:
    """The ids of the instances for which the write pass would change anything: a maximum
    runtime within its warning's lead, an idle warning standing (to end, renew or act on),
    or idle time within its warning's lead. Reads only, the idle times of all in a few
    queries."""
    due: list[int] = []
    looked: list[tuple[Instance, int]] = []
    for instance in instances:
        limit = instance.max_runtime_minutes
        started = instance.started_at or now
        minutes = autostop.effective_idle_minutes(instance, ceiling)
        if instance.idle_warned_at is not None or (
            limit is not None and _runtime_warning_due(started, limit, now)
        ):
            due.append(instance.id)
        elif minutes is not None:
            looked.append((instance, minutes))
    since = autostop.idle_since_many(session, looked, now)
    for instance, minutes in looked:
        if _idle_warning_due(now - since[instance.id], minutes):
            due.append(instance.id)
    return due


def _runtime_warning_due(started: datetime, limit: int, now: datetime) -> bool:
    """Whether a maximum runtime of limit minutes from started is within its warning's lead
    (or past): the read pass and the write pass judge by this one rule."""
    return now >= started + timedelta(minutes=limit) - autostop.warning_lead(limit)


def _idle_warning_due(idle_for: timedelta, minutes: int) -> bool:
    """Whether idle time is within its warning's lead of an idle window of minutes (or past
    it): the read pass and the write pass judge by this one rule."""
    return idle_for >= timedelta(minutes=minutes) - autostop.warning_lead(minutes)


def _warn_runtime(
    session: Session, instance: Instance, started: datetime, limit: int, now: datetime
) -> None:
    """Tell the owner, once per start, a lead time before the maximum runtime stops it."""
    if not _runtime_warning_due(started, limit, now):
        return
    stop_at = started + timedelta(minutes=limit)
    notifications.notify_once(
        session,
        instance.owner_id,
        "runtime_warning",
        f"max-runtime-warning:{instance.id}:{started.isoformat()}",
        f"instance {instance.name} reaches its maximum runtime of "
        f"{autostop.minutes_text(limit)} at {stop_at:%H:%M} UTC and will be stopped then, "
        f"workspace kept; to give it longer: `gpulease instance autostop {instance.name} "
        "--max-runtime MINUTES`",
    )


def _idle_step(session: Session, instance: Instance, minutes: int, now: datetime) -> bool:
    """Warn, stop, or end a warning. Returns whether it stopped the instance."""
    started = instance.started_at
    if instance.idle_warned_at is not None and started and instance.idle_warned_at < started:
        instance.idle_warned_at = None  # a warning of an earlier start: this one warns anew
    idle_for = now - autostop.idle_since(session, instance, now, minutes)
    if not _idle_warning_due(idle_for, minutes):
        instance.idle_warned_at = None  # busy again: the next idle period warns again
        return False
    window = timedelta(minutes=minutes)
    lead = autostop.warning_lead(minutes)
    util = autostop.idle_util_pct(instance)
    what = (
        f"GPU utilisation under {util:g}% and no run, terminal or notebook activity"
        if instance.gpu_count
        else "no run, terminal or notebook activity"
    )
    if instance.idle_warned_at is None:
        idle_minutes = int(idle_for.total_seconds() // 60)
        instance.idle_warned_at = now
        stop_at = now + lead
        notifications.notify_once(
            session,
            instance.owner_id,
            "idle_warning",
            f"idle-warning:{instance.id}:{now.isoformat()}",
            f"instance {instance.name} has been idle for {autostop.minutes_text(idle_minutes)} "
            f"({what}); it will be stopped at {stop_at:%H:%M} UTC, workspace kept, unless "
            "it gets busy or you use its terminal or notebook",
        )
        return False
    if idle_for < window or now < instance.idle_warned_at + lead:
        return False
    reason = f"idle: {what} for {autostop.minutes_text(minutes)}; workspace kept"
    stop_instance(session, instance, reason)
    notifications.notify_once(
        session,
        instance.owner_id,
        "instance_stopped_idle",
        f"idle-stop:{instance.id}:{instance.idle_warned_at.isoformat()}",
        f"instance {instance.name} was stopped as idle ({what} for "
        f"{autostop.minutes_text(minutes)}); its workspace is kept: start it again with "
        f"`gpulease instance start {instance.name}`",
    )
    instance.idle_warned_at = None
    return True
