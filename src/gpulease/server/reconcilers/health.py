"""Find runners that died or went silent, fail their instances with the reason, free GPUs."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select

from gpulease.server.db import readers, transaction, utcnow
from gpulease.server.orm import Instance
from gpulease.server.runtime import Runtime
from gpulease.server.services import notifications
from gpulease.server.services.instances.states import FAILED, RUNNING, STARTING, switch_status

# A runner still building its environment may be busy for long; one serving runs heartbeats.
STARTING_SILENCE = timedelta(minutes=30)


def tick(rt: Runtime, *, check_all: bool = False, now: datetime | None = None) -> list[int]:
    """Check live instances' runners. check_all (used at server start) checks every runner's
    process now instead of waiting for its heartbeat to go stale; `now` (default: the real
    time) is when silence is measured to. Returns failed ids."""
    timeout = timedelta(seconds=rt.settings.heartbeat_timeout_s)
    now = now or utcnow()
    with transaction(readers(rt.sessions)) as session:  # only reads: no write lock
        rows = [
            (i.id, i.status, i.runner_handle, i.last_heartbeat_at or i.runner_launched_at)
            for i in session.scalars(
                select(Instance).where(
                    Instance.status.in_((STARTING, RUNNING)),
                    Instance.runner_handle.is_not(None),
                )
            )
        ]
    failed = []
    for instance_id, status, handle, last_seen in rows:
        assert handle is not None
        silent = now - last_seen if last_seen else timedelta.max
        if not check_all and silent < timeout:
            continue
        reason = None
        if not rt.backend.alive(handle):
            reason = (
                f"its runner process exited unexpectedly (last heard from {last_seen:%H:%M:%S} UTC)"
            )
        elif silent > (STARTING_SILENCE if status == STARTING else timeout * 4):
            rt.backend.stop(handle, force=True)
            reason = (
                f"its runner stopped responding for {int(silent.total_seconds())} s and was killed"
            )
        if reason is None:
            continue
        with transaction(rt.sessions) as session:
            instance = session.get(Instance, instance_id)
            if instance is None or instance.status != status:
                continue
            switch_status(session, instance, FAILED, reason, at=last_seen)
            notifications.notify(
                session,
                instance.owner_id,
                "instance_failed",
                f"instance {instance.name} failed: {reason}",
            )
            failed.append(instance_id)
    return failed
