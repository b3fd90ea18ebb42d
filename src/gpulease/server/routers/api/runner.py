"""The runner protocol (docs/runner-protocol.md): runners talk to the server only here."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gpulease.core.errors import Gone
from gpulease.schemas.runner import (
    RUNNER_API,
    RunnerAction,
    RunnerCommands,
    RunnerExit,
    RunnerFailed,
    RunnerHeartbeat,
    RunnerLogs,
    RunnerReady,
    RunnerRun,
    RunnerSession,
    RunnerStarted,
    RunnerStatus,
    RunnerStreamEntry,
    RunnerTask,
)
from gpulease.server.orm import Instance
from gpulease.server.routers.deps import read_tx, runner_token, runtime, tx
from gpulease.server.runner_doorbell import FALLBACK_S, Listener, doorbell
from gpulease.server.services import preemption, runners, runs, templates
from gpulease.server.services.streams import hub_of

router = APIRouter(prefix=RUNNER_API, tags=["runner"])
MAX_WAIT_S = 30.0


def _runner_call(
    request: Request,
    act: Callable[[Session, Instance], object],
    *,
    logs: bool = False,
    runs_wanted: bool = False,
    reconcile: bool = False,
) -> Response:
    """act(session, the calling runner's instance) in one transaction, then, once it is
    committed, wake the log streams, the run dispatch and the reconcilers as asked; 204."""
    with tx(request) as session:
        act(session, runners.instance_for_token(session, runner_token(request)))
    if logs:
        request.app.state.signals.logs.fire()
    if runs_wanted:
        request.app.state.signals.runs.fire()
    if reconcile:
        request.app.state.wake_reconcilers()
    return Response(status_code=204)


@router.post("/status", status_code=204)
def status(body: RunnerStatus, request: Request) -> Response:
    return _runner_call(request, lambda s, i: runners.report_status(s, i, body.message))


@router.post("/session", status_code=204)
def open_session(body: RunnerSession, request: Request) -> Response:
    """The runner's token becomes body.token; the one it called with stops working."""
    return _runner_call(request, lambda s, i: runners.open_session(s, i, body.token))


@router.post("/ready", status_code=204)
def ready(body: RunnerReady, request: Request) -> Response:
    return _runner_call(request, runners.ready, runs_wanted=True)


@router.post("/heartbeat")
def heartbeat(body: RunnerHeartbeat, request: Request) -> RunnerAction:
    with tx(request) as session:
        instance = runners.instance_for_token(session, runner_token(request))
        action = runners.heartbeat(session, instance)
        grace = preemption.notice_grace(instance, runtime(request).settings.preempt_grace_s)
        return RunnerAction(action=action, preempt_grace_s=grace if action == "stop" else None)


@router.get("/commands")
async def commands(request: Request, wait: float = 20.0) -> RunnerCommands:
    """Long poll: answers as soon as there is a run, stream or task for the runner or the
    instance is stopping, or empty after `wait` seconds. No transaction or worker thread is
    held while waiting: the instance's doorbell (runner_doorbell.py) wakes it, and the
    database is re-read every FALLBACK_S for changes other replicas made."""
    token = runner_token(request)
    deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT_S)

    def _pending() -> tuple[int, RunnerCommands]:
        # Reads only: a poll neither waits for the database's writers (a billing tick) nor
        # holds them up, however many runners poll.
        with read_tx(request) as session:
            instance = runners.instance_for_token(session, token)
            tasks = [
                RunnerTask(id=t.id, kind=templates.SNAPSHOT_TASK)
                for t in templates.pending_tasks(session, instance)
            ]
            found = [
                RunnerRun(id=r.id, command=r.command, env=r.env)
                for r in runners.pending_runs(session, instance)
            ]
            stop = runners.stop_wanted(instance)
            grace = preemption.notice_grace(instance, runtime(request).settings.preempt_grace_s)
            return instance.id, RunnerCommands(
                runs=found, tasks=tasks, stop=stop, preempt_grace_s=grace if stop else None
            )

    hub = hub_of(request.app.state)  # terminal and Jupyter streams (services/streams.py)
    instance_id, answer = await run_in_threadpool(_pending)
    with doorbell.listen(instance_id) as bell:
        while True:
            answer.streams = [RunnerStreamEntry.model_validate(s) for s in hub.wanted(instance_id)]
            left = deadline - time.monotonic()
            if answer.runs or answer.streams or answer.tasks or answer.stop or left <= 0:
                return answer
            if await request.is_disconnected():
                return answer
            await _woken(request, bell, min(left, FALLBACK_S))
            instance_id, answer = await run_in_threadpool(_pending)


async def _woken(request: Request, bell: Listener, timeout: float) -> None:
    """Until the instance's bell rings, a run or stream is announced (signals.runs), or
    timeout."""
    waits = [
        asyncio.ensure_future(bell.wait(timeout)),
        asyncio.ensure_future(request.app.state.signals.runs.wait(timeout)),
    ]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()


@router.post("/runs/{run_id}/started", status_code=204)
def run_started(run_id: int, body: RunnerStarted, request: Request) -> Response:
    return _runner_call(
        request, lambda s, i: runners.run_started(s, i, runners.run_of(s, i, run_id)), logs=True
    )


@router.post("/runs/{run_id}/logs", status_code=204)
def run_logs(run_id: int, body: RunnerLogs, request: Request) -> Response:
    chunks = [(c.seq, c.stream, c.data, c.time) for c in body.chunks]
    return _runner_call(
        request, lambda s, i: runs.append_logs(s, runners.run_of(s, i, run_id), chunks), logs=True
    )


@router.post("/runs/{run_id}/exit", status_code=204)
def run_exit(run_id: int, body: RunnerExit, request: Request) -> Response:
    def exited(session: Session, instance: Instance) -> None:
        runners.run_exited(
            session, instance, runners.run_of(session, instance, run_id), body.exit_code
        )

    return _runner_call(request, exited, logs=True, reconcile=True)


@router.get("/workdir", response_model=None)
def workdir(request: Request) -> Response:
    """The instance's uploaded workdir archive (200), none (204), or 410 when its file is no
    longer in the server's uploads folder."""
    with tx(request) as session:
        instance = runners.instance_for_token(session, runner_token(request))
        upload, name = instance.workdir_upload, instance.name
    if not upload:
        return Response(status_code=204)
    try:  # held open while it is sent: the file may be deleted meanwhile
        archive = open(upload, "rb")  # noqa: SIM115 (_chunks closes it once sent)
        size = os.fstat(archive.fileno()).st_size
    except OSError as exc:
        raise Gone(
            f"the workdir uploaded for instance {name} is no longer on the server "
            f"({exc.strerror}); release the instance and run the task again"
        ) from None
    headers = {"Content-Length": str(size)}
    return StreamingResponse(_chunks(archive), media_type="application/gzip", headers=headers)


def _chunks(archive: BinaryIO) -> Iterator[bytes]:
    with archive:
        while block := archive.read(1024 * 1024):
            yield block


@router.post("/stopped", status_code=204)
def stopped(request: Request) -> Response:
    return _runner_call(request, runners.stopped, logs=True, reconcile=True)


@router.post("/failed", status_code=204)
def failed(body: RunnerFailed, request: Request) -> Response:
    return _runner_call(
        request, lambda s, i: runners.failed(s, i, body.reason), logs=True, reconcile=True
    )
