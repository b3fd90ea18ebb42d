"""A real runner process: it answers the snapshot_env task with its venv's `pip freeze`, and
its runs can call `python -m gpulease.doctor` (written into the SDK directory)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request, Response
from fastapi.responses import JSONResponse

from gpulease.backends.base import RunnerSpec
from gpulease.backends.local import LocalBackend
from gpulease.core.templates import get_template
from gpulease.runner.sandbox import find_bwrap, probe
from runner.test_runner_agent import (  # the fake server and runner fixtures, shared
    TOKEN,
    FakeServer,
    Started,
    env_cache,
    server,
    start_runner,
    wait_until,
)

__all__ = ["env_cache", "server", "start_runner"]


def test_snapshot_task_and_doctor_in_a_run(
    server: FakeServer, start_runner: Callable[..., Started]
) -> None:
    results: dict[int, Any] = {}
    answer = server.answer

    async def with_tasks(path: str, request: Request) -> Response:
        if path == "commands" and 5 not in results:
            tasks = [{"id": 5, "kind": "snapshot_env"}, {"id": 6, "kind": "from-the-future"}]
            pending = [run for run in server.runs if run["id"] not in server.started]
            return JSONResponse({"runs": pending, "tasks": tasks})
        if path.startswith("tasks/"):
            results[int(path.split("/")[1])] = await request.json()
            return Response(status_code=204)
        return await answer(path, request)

    server.answer = with_tasks  # type: ignore[method-assign]
    server.runs = [{"id": 4, "command": "python -m gpulease.doctor", "env": {}}]

    runner = start_runner()
    assert wait_until(lambda: 5 in results and 4 in server.exits, 60), runner.log()
    server.action = "stop"
    runner.wait_exit()

    assert list(results) == [5]  # the unknown kind is ignored
    assert results[5] == {"packages": []}  # a bare `python` venv: pip freeze lists nothing
    out = server.output(4)
    assert "gpulease doctor: Python" in out["stdout"], out
    assert "not installed in this environment" in out["stdout"]
    assert server.exits[4] == 0


# The job's replacement for its layer's python: it tries to read the runner's own files by
# their host paths, leaves a process behind and prints a "freeze" of its choosing.
EVIL_PYTHON = """#!/bin/sh
cat {spec} > /workspace/stolen 2>/dev/null
ls {run_dir} >> /workspace/stolen 2>/dev/null
setsid sh -c 'sleep 300' {marker} </dev/null >/dev/null 2>&1 &
echo evil==6.6.6
"""
PLANT = (
    "rm .gpulease/venv/bin/python && printf '%s' \"$EVIL\" > .gpulease/venv/bin/python "
    "&& chmod 755 .gpulease/venv/bin/python && echo planted"
)


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
    return found


@pytest.mark.skipif(find_bwrap() is None or probe() is not None, reason="no sandbox here")
def test_a_replaced_layer_python_is_run_only_in_the_sandbox(
    server: FakeServer, start_runner: Callable[..., Started], tmp_path: Path, env_cache: Path
) -> None:
    """`gpulease templates save` after the job swapped its layer's python: the program runs
    in the sandbox as the job (it cannot see the runner's files) and nothing it started
    outlives the instance's stop."""
    marker = f"gpulease-freeze-leftover-{os.getpid()}-{time.monotonic_ns()}"
    run_dir = tmp_path / "sandboxed-run"
    evil = EVIL_PYTHON.format(spec=run_dir / "spec.json", run_dir=run_dir, marker=marker)
    results: dict[int, Any] = {}
    answer = server.answer

    async def with_task(path: str, request: Request) -> Response:
        if path == "commands" and 3 in server.exits and 5 not in results:
            return JSONResponse({"runs": [], "tasks": [{"id": 5, "kind": "snapshot_env"}]})
        if path.startswith("tasks/"):
            results[int(path.split("/")[1])] = await request.json()
            return Response(status_code=204)
        return await answer(path, request)

    server.answer = with_task  # type: ignore[method-assign]
    server.runs = [{"id": 3, "command": PLANT, "env": {"EVIL": evil}}]
    backend = LocalBackend()
    spec = RunnerSpec(
        instance_id=77,
        server_url=server.url,
        token=TOKEN,
        workspace=tmp_path / "sandboxed-workspace",
        run_dir=run_dir,
        env_cache=env_cache,
        template=get_template("python"),
        heartbeat_interval_s=0.2,
        sandbox=True,
    )
    runner = Started(backend, backend.start(spec), spec)
    try:
        assert wait_until(lambda: 5 in results, 90), runner.log()
        assert "planted" in server.output(3)["stdout"], server.output(3)
        assert results[5] == {"packages": ["evil==6.6.6"]}
        stolen = (spec.workspace / "stolen").read_text()
        assert TOKEN not in stolen and "spec.json" not in stolen, stolen
        server.action = "stop"
        runner.wait_exit()
    finally:
        backend.stop(runner.handle, force=True)
    assert wait_until(lambda: not _processes_with(marker), 5), _processes_with(marker)
