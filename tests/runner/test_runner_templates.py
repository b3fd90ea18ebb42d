"""A real runner process: it answers the snapshot_env task with its venv's `pip freeze`, and
its runs can call `python -m gpulease.doctor` (written into the SDK directory)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from runner.test_runner_agent import (  # the fake server and runner fixtures, shared
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
