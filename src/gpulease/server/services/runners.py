"""The server's side of the runner protocol (docs/runner-protocol.md)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.errors import Conflict, Unauthorized
from gpulease.server.db import utcnow
from gpulease.server.orm import Instance, Run
from gpulease.server.security import hash_token
from gpulease.server.services import notifications
from gpulease.server.services.instances.states import (
    FAILED,
    RUNNING,
    STARTING,
    STOPPED,
    STOPPING,
    switch_status,
)
from gpulease.server.services.rows import find_all, get_owned
from gpulease.server.services.runs import is_finished, notify_run_ended


def instance_for_token(session: Session, token: str) -> Instance:
    instance = session.scalar(
        select(Instance).where(Instance.runner_token_hash == hash_token(token))
    )
    if instance is None:
        raise Unauthorized("unknown runner token: this instance no longer holds a runner")
    return instance


def open_session(session: Session, instance: Instance, token: str) -> None:
    """Bind the instance's runner token to the runner process: from now on only token (made by
    the runner, never written to a file) works, and the launch secret of its spec or any
    earlier session token is refused with 401. Repeating it with token itself changes
    nothing, so a runner whose answer got lost can ask again."""
    _seen(instance)
    instance.runner_token_hash = hash_token(token)


def _seen(instance: Instance) -> None:
    instance.last_heartbeat_at = utcnow()


def report_status(session: Session, instance: Instance, message: str) -> None:
    _seen(instance)
    instance.status_message = message[:500]


def ready(session: Session, instance: Instance) -> None:
    _seen(instance)
    if instance.status == RUNNING:
        return
    if instance.status != STARTING:
        raise Conflict(f"instance is {instance.status}; stop")
    switch_status(session, instance, RUNNING, "")


def heartbeat(session: Session, instance: Instance) -> str:
    _seen(instance)
    return "stop" if stop_wanted(instance) else "continue"


def stop_wanted(instance: Instance) -> bool:
    """The runner should stop its runs, call /stopped and exit."""
    return instance.status == STOPPING or instance.desired_state != "running"


def pending_runs(session: Session, instance: Instance) -> list[Run]:
    """The runs waiting for the instance's runner. A read only: the long poll asks it on
    every wake, and the runner's heartbeats (its own thread) tell that it is alive."""
    if instance.status != RUNNING:
        return []
    return find_all(session, Run, Run.instance_id == instance.id, Run.status == "pending")


def run_of(session: Session, instance: Instance, run_id: int) -> Run:
    return get_owned(
        session,
        Run,
        run_id,
        f"run {run_id} does not belong to this instance",
        instance_id=instance.id,
    )


def run_started(session: Session, instance: Instance, run: Run) -> None:
    _seen(instance)
    if run.status == "pending":
        run.status = "running"
        run.started_at = utcnow()


def run_exited(session: Session, instance: Instance, run: Run, exit_code: int) -> None:
    _seen(instance)
    if is_finished(run):
        return
    run.exit_code = exit_code
    run.status = "succeeded" if exit_code == 0 else "failed"
    run.status_reason = "" if exit_code == 0 else f"exited with code {exit_code}"
    run.finished_at = utcnow()
    if run.started_at is None:
        run.started_at = run.finished_at
    notify_run_ended(session, run, instance)
    if run.stop_instance_on_exit and instance.status in (STARTING, RUNNING):
        instance.desired_state = "released" if instance.auto_release else "stopped"
        switch_status(session, instance, STOPPING, f"its run {run.id} ended")


def stopped(session: Session, instance: Instance) -> None:
    if instance.status in (STARTING, RUNNING, STOPPING):
        switch_status(session, instance, STOPPED, instance.status_reason or "stopped")


def failed(session: Session, instance: Instance, reason: str) -> None:
    if instance.status in (STARTING, RUNNING, STOPPING):
        switch_status(session, instance, FAILED, f"runner failed: {reason[:400]}")
        notifications.notify(
            session,
            instance.owner_id,
            "instance_failed",
            f"instance {instance.name} failed: {reason[:400]}",
        )
