"""Runs: commands executed in an instance, their logs and exit codes."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.errors import Conflict, InvalidInput, NotFound
from gpulease.core.ids import MAX_ID
from gpulease.core.run_commands import own_command
from gpulease.schemas.runs import RunCreate
from gpulease.server.db import utcnow
from gpulease.server.orm import Instance, LogChunk, Run, User
from gpulease.server.runner_doorbell import ring_after_commit
from gpulease.server.services import notifications
from gpulease.server.services.instances.states import ACTIVE

MAX_COMMAND = 100_000
MAX_ENV = 200
MAX_TASK_NAME = 100  # the column's length


def task_name_of(name: str | None) -> str | None:
    """A run's task name as stored: trimmed, None when blank; one line of printable
    characters (it is shown in tables, pages and notices), at most MAX_TASK_NAME long."""
    name = (name or "").strip()
    if not name:
        return None
    if len(name) > MAX_TASK_NAME:
        raise InvalidInput(f"the task name is longer than {MAX_TASK_NAME} characters")
    if not name.isprintable():
        bad = next(char for char in name if not char.isprintable())
        raise InvalidInput(f"the task name contains {bad!r}; use printable characters only")
    return name


def create_run(
    session: Session,
    instance: Instance,
    command: str,
    env: dict[str, str],
    *,
    stop_instance_on_exit: bool = False,
    task_name: str | None = None,
) -> Run:
    task_name = task_name_of(task_name)
    if not command.strip():
        raise InvalidInput("the command is empty; give one after --, e.g. `-- python train.py`")
    if len(command) > MAX_COMMAND:
        raise InvalidInput(f"the command is longer than {MAX_COMMAND} characters; use a script")
    if len(env) > MAX_ENV:
        raise InvalidInput(f"at most {MAX_ENV} environment variables per run")
    if instance.status not in ACTIVE or instance.desired_state != "running":
        raise Conflict(
            f"instance {instance.name} is {instance.status}; start it first with "
            f"`gpulease instance start {instance.name}`"
        )
    run = Run(
        instance_id=instance.id,
        owner_id=instance.owner_id,
        command=command,
        task_name=task_name,
        env=dict(env),
        status="pending",
        stop_instance_on_exit=stop_instance_on_exit,
        created_at=utcnow(),
    )
    session.add(run)
    session.flush()
    ring_after_commit(session, instance.id)  # the runner's long poll answers at once
    return run


def create_requested_run(session: Session, instance: Instance, body: RunCreate) -> Run:
    """create_run with what a request body asks for (POST /instances/{ref}/runs, /exec)."""
    return create_run(
        session,
        instance,
        body.command,
        body.env,
        stop_instance_on_exit=body.stop_instance_on_exit,
        task_name=body.task_name,
    )


def get_run(session: Session, owner: User, run_id: int) -> Run:
    run = session.get(Run, run_id)
    if run is None or run.owner_id != owner.id:
        raise NotFound(f"you have no run {run_id}; see `gpulease runs`")
    return run


def list_runs(
    session: Session, owner: User, instance_id: int | None = None, limit: int = 100
) -> list[Run]:
    query = select(Run).where(Run.owner_id == owner.id)
    if instance_id is not None:
        query = query.where(Run.instance_id == instance_id)
    return list(session.scalars(query.order_by(Run.id.desc()).limit(limit)))


def read_logs(session: Session, run: Run, after: int = -1, limit: int = 1000) -> list[LogChunk]:
    """Chunks with seq > after, in order. Any `after` is fine: no seq lies beyond a 64-bit
    integer, so a larger one (which the database could not compare) finds nothing."""
    after = max(-1, min(after, MAX_ID))
    return list(
        session.scalars(
            select(LogChunk)
            .where(LogChunk.run_id == run.id, LogChunk.seq > after)
            .order_by(LogChunk.seq)
            .limit(limit)
        )
    )


def append_logs(session: Session, run: Run, chunks: list[tuple[int, str, str, float]]) -> None:
    """Store (seq, stream, data, unix time) chunks; a seq already stored is skipped, so a
    runner's retry never duplicates output."""
    if not chunks:
        return
    seqs = [c[0] for c in chunks]
    have = set(
        session.scalars(
            select(LogChunk.seq).where(LogChunk.run_id == run.id, LogChunk.seq.in_(seqs))
        )
    )
    for seq, stream, data, time in chunks:
        if seq in have or seq < 0:
            continue
        have.add(seq)
        session.add(
            LogChunk(
                run_id=run.id,
                seq=seq,
                stream=stream if stream in ("stdout", "stderr") else "stdout",
                data=data,
                time=datetime.fromtimestamp(time, UTC),
            )
        )
    session.flush()


def is_finished(run: Run) -> bool:
    return run.status in ("succeeded", "failed")


def notify_run_ended(session: Session, run: Run, instance: Instance) -> None:
    """run_finished / run_failed for the owner: the run, its task's name, its own command
    (not a task file's setup wrapper) and its exit code."""
    command = " ".join(own_command(run.command).split())
    if len(command) > 120:
        command = command[:117] + "..."
    task = f" (task {run.task_name!r})" if run.task_name else ""
    notifications.notify(
        session,
        run.owner_id,
        "run_finished" if run.status == "succeeded" else "run_failed",
        f"run {run.id}{task} on {instance.name} {run.status} "
        f"(exit code {run.exit_code}): {command}",
    )
