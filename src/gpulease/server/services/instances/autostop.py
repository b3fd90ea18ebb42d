"""Automatic stop of an instance: its settings, and when it counts as idle or overdue.

Idle, for an instance with readings of real GPUs in the idle window (T minutes): every GPU
sample of the window is under X % utilisation, and there was no terminal or notebook
activity (`last_activity_at`) in it. For an instance without readings (simulated GPUs,
CPU-only, or a sampler that sent nothing in the window) nothing is invented: it is idle
when no run of it was pending or running at any moment of the window and there was no
terminal or notebook activity. Either way the window starts no earlier than the instance's
last start, so a fresh start is never idle at once.

The owner is warned (notification `idle_warning`) a lead time before T; the stop itself
waits until that warning is at least the lead time old, so nobody is stopped unwarned even
after a server outage.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpulease.core.errors import Conflict, InvalidInput
from gpulease.core.records import from_attributes
from gpulease.schemas.autostop import AutostopPublic
from gpulease.server.db import batches
from gpulease.server.orm import GpuSample, Instance, Run
from gpulease.server.services.rows import get_owned

DEFAULT_IDLE_UTIL_PCT = 5.0
MIN_IDLE_MINUTES = 5
MAX_IDLE_MINUTES = 7 * 24 * 60
MAX_RUNTIME_MINUTES = 90 * 24 * 60
# The warning goes out this long before the stop: 5 minutes, or a fifth of T if shorter.
WARNING_LEAD = timedelta(minutes=5)


def effective_idle_minutes(instance: Instance, ceiling: int | None) -> int | None:
    """The idle time that applies: the owner's, never above the operator's ceiling, which
    also applies to instances whose owner set nothing."""
    own = instance.idle_minutes
    if ceiling is None:
        return own
    return ceiling if own is None else min(own, ceiling)


def idle_util_pct(instance: Instance) -> float:
    return instance.idle_util_pct if instance.idle_util_pct is not None else DEFAULT_IDLE_UTIL_PCT


def minutes_text(minutes: int) -> str:
    """'45 min', '8 h', '1 h 30 min'."""
    hours, rest = divmod(minutes, 60)
    if not hours:
        return f"{rest} min"
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def warning_lead(idle_minutes: int) -> timedelta:
    return min(WARNING_LEAD, timedelta(minutes=idle_minutes) / 5)


def check_settings(
    *,
    idle_util: float | None,
    idle_minutes: int | None,
    max_runtime_minutes: int | None,
    ceiling: int | None,
) -> None:
    """Refuse settings that make no sense, saying what would."""
    if idle_util is not None and not 0 < idle_util <= 100:
        raise InvalidInput(
            f"idle_util_pct {idle_util} is not a percentage: give the GPU utilisation under "
            "which the instance counts as idle, above 0 and at most 100, e.g. 5"
        )
    if idle_minutes is not None:
        if ceiling is not None and idle_minutes > ceiling:
            raise InvalidInput(
                f"idle_minutes {idle_minutes} is above this server's ceiling of {ceiling} "
                f"minutes (set by the operator); ask for {ceiling} or less"
            )
        if not MIN_IDLE_MINUTES <= idle_minutes <= MAX_IDLE_MINUTES:
            raise InvalidInput(
                f"idle_minutes must be between {MIN_IDLE_MINUTES} and {MAX_IDLE_MINUTES} "
                "(a week), e.g. 30"
            )
    elif idle_util is not None and ceiling is None:
        raise InvalidInput(
            "idle_util_pct alone stops nothing: give idle_minutes too, e.g. idle_minutes 30"
        )
    if max_runtime_minutes is not None and not 1 <= max_runtime_minutes <= MAX_RUNTIME_MINUTES:
        raise InvalidInput(
            f"max_runtime_minutes must be between 1 and {MAX_RUNTIME_MINUTES} (90 days), "
            "e.g. 480 for 8 hours"
        )


def set_autostop(
    session: Session,
    instance: Instance,
    *,
    idle_util: float | None,
    idle_minutes: int | None,
    max_runtime_minutes: int | None,
    stop_after_run: int | None,
    ceiling: int | None,
) -> None:
    """Replace the instance's automatic-stop setting (None turns a part off)."""
    check_settings(
        idle_util=idle_util,
        idle_minutes=idle_minutes,
        max_runtime_minutes=max_runtime_minutes,
        ceiling=ceiling,
    )
    instance.idle_util_pct = idle_util
    instance.idle_minutes = idle_minutes
    instance.idle_warned_at = None  # a new setting starts a new idle period
    instance.max_runtime_minutes = max_runtime_minutes
    set_stop_after_run(session, instance, stop_after_run)


def set_stop_after_run(session: Session, instance: Instance, run_id: int | None) -> None:
    """Make the end of one of the instance's runs stop it (None: no run does any more)."""
    previous = instance.stop_after_run_id
    if previous is not None and previous != run_id:
        old = session.get(Run, previous)
        if old is not None and old.instance_id == instance.id and old.finished_at is None:
            old.stop_instance_on_exit = False
    if run_id is None:
        instance.stop_after_run_id = None
        return
    run = get_owned(
        session,
        Run,
        run_id,
        f"instance {instance.name} has no run {run_id}; see `gpulease runs` for its runs",
        instance_id=instance.id,
    )
    if run.status in ("succeeded", "failed"):
        raise Conflict(
            f"run {run_id} already ended ({run.status}); stop the instance now with "
            f"`gpulease instance stop {instance.name}`"
        )
    run.stop_instance_on_exit = True
    instance.stop_after_run_id = run.id


def idle_since(session: Session, instance: Instance, now: datetime, minutes: int) -> datetime:
    """Since when the instance has been idle, looking back over its idle window of
    `minutes` (the module's docstring says what idle means). `now` when it is busy now."""
    return idle_since_many(session, [(instance, minutes)], now)[instance.id]


def idle_since_many(
    session: Session, looked: Sequence[tuple[Instance, int]], now: datetime
) -> dict[int, datetime]:
    """idle_since of each (instance, minutes), by instance id: a few queries for each
    500 instances that share a window and a utilisation threshold (usually all of them, under
    the operator's ceiling), where one instance at a time took up to three each."""
    since: dict[int, datetime] = {}
    unsampled: list[Instance] = []
    groups: dict[tuple[int, float], list[Instance]] = {}
    for instance, minutes in looked:
        groups.setdefault((minutes, idle_util_pct(instance)), []).append(instance)
    for (minutes, util), members in groups.items():
        window_start = now - timedelta(minutes=minutes)
        in_window = (GpuSample.time >= window_start, GpuSample.util_pct.is_not(None))
        for batch in batches(members):
            ids = [i.id for i in batch]
            sampled = set(
                session.scalars(
                    select(GpuSample.instance_id)
                    .where(GpuSample.instance_id.in_(ids), *in_window)
                    .distinct()
                )
            )
            busy: dict[int, datetime] = {}
            if sampled:  # none has readings (simulated GPUs, CPU only): nothing to ask
                busy = {
                    instance_id: at
                    for instance_id, at in session.execute(
                        select(GpuSample.instance_id, func.max(GpuSample.time))
                        .where(
                            GpuSample.instance_id.in_(sorted(sampled)),
                            *in_window,
                            GpuSample.util_pct >= util,
                        )
                        .group_by(GpuSample.instance_id)
                    )
                    if instance_id is not None
                }
            for instance in batch:
                if instance.id in sampled:
                    last_busy = busy.get(instance.id)
                    floor = _idle_floor(instance, now)
                    since[instance.id] = floor if last_busy is None else max(floor, last_busy)
                else:
                    unsampled.append(instance)
    for batch in batches(unsampled):
        ids = [i.id for i in batch]
        running = set(
            session.scalars(
                select(Run.instance_id)
                .where(Run.instance_id.in_(ids), Run.status.in_(("pending", "running")))
                .distinct()
            )
        )
        ended: dict[int, datetime] = {
            instance_id: at
            for instance_id, at in session.execute(
                select(Run.instance_id, func.max(Run.finished_at))
                .where(Run.instance_id.in_(ids))
                .group_by(Run.instance_id)
            )
            if at is not None
        }
        for instance in batch:
            floor = _idle_floor(instance, now)
            if instance.id in running:
                since[instance.id] = now
            else:
                last_end = ended.get(instance.id)
                since[instance.id] = floor if last_end is None else max(floor, last_end)
    return since


def _idle_floor(instance: Instance, now: datetime) -> datetime:
    """The earliest an instance's idle time may start: its last start, or its last terminal
    or notebook activity after it."""
    floor = instance.started_at or now
    if instance.last_activity_at is not None:
        floor = max(floor, instance.last_activity_at)
    return floor


def public(instance: Instance, ceiling: int | None) -> AutostopPublic:
    minutes = effective_idle_minutes(instance, ceiling)
    stop_at = None
    warned = instance.idle_warned_at if instance.status == "running" else None
    if warned is not None and minutes is not None:
        stop_at = warned + warning_lead(minutes)
    runtime_stop = None
    if instance.max_runtime_minutes is not None and instance.status == "running":
        started = instance.started_at
        if started is not None:
            runtime_stop = started + timedelta(minutes=instance.max_runtime_minutes)
    return from_attributes(
        AutostopPublic,
        instance,
        instance_id=instance.id,
        idle_util_pct=idle_util_pct(instance),
        idle_minutes_effective=minutes,
        idle_ceiling_minutes=ceiling,
        stop_after_run=instance.stop_after_run_id,
        idle_warned_at=warned,
        idle_stop_at=stop_at,
        max_runtime_stop_at=runtime_stop,
    )
