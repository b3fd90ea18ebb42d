"""The runner's snapshot_env task: `pip freeze` of an instance's venv, posted to the server."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from gpulease.envs.build import env_python
from gpulease.envs.layer import where
from gpulease.runner.sandbox import Sandbox, SandboxError

log = logging.getLogger(__name__)

SNAPSHOT_TASK = "snapshot_env"
FREEZE_TIMEOUT_S = 120.0
MAX_LINES = 5000
MAX_LINE_CHARS = 1000


class _Caller(Protocol):
    def call(self, method: str, path: str, *, json: Any = None) -> Any: ...


def freeze(
    env_dir: Path,
    timeout: float = FREEZE_TIMEOUT_S,
    *,
    sandbox: Sandbox | None = None,
) -> list[str]:
    """`pip freeze` of the venv at env_dir, one requirement per line. Raises RuntimeError
    with pip's message when it fails.

    The venv is the instance's layer, which the job can write: its python may be any
    program. So with a sandbox it runs there, as the job (env_dir is then the layer of
    the workspace the sandbox shows), and what it prints is read as hostile text: at most
    MAX_LINES lines of at most MAX_LINE_CHARS characters, from bounded output. Without
    one the jobs run on the host as the runner does, and so does pip.
    """
    execute, inside = where(sandbox, env_dir)
    python = env_python(inside)
    argv = [str(python), "-m", "pip", "freeze", "--disable-pip-version-check"]
    try:
        outcome = execute(argv, {"PATH": "/usr/bin:/bin", "PIP_NO_INPUT": "1"}, timeout)
    except (OSError, SandboxError) as exc:
        raise RuntimeError(f"pip freeze could not run: {exc}") from exc
    if outcome.truncated:
        raise RuntimeError("pip freeze printed more than 1 MiB; that is no list of packages")
    if outcome.returncode is None:
        raise RuntimeError(f"pip freeze did not finish in {timeout:.0f} s")
    if outcome.returncode != 0:
        raise RuntimeError(
            f"pip freeze failed with exit code {outcome.returncode}: {outcome.error_tail()}"
        )
    lines = [line.strip() for line in outcome.text().splitlines() if line.strip()]
    if len(lines) > MAX_LINES or any(len(line) > MAX_LINE_CHARS for line in lines):
        raise RuntimeError(
            f"pip freeze printed more than {MAX_LINES} lines or a line longer than "
            f"{MAX_LINE_CHARS} characters; that is no list of packages"
        )
    return lines


class TaskRunner:
    """Runs each task the server lists once (the long poll repeats a task until answered),
    in a thread of its own so a slow pip never holds up runs."""

    def __init__(
        self,
        connection: _Caller,
        env_dir: Path,
        api: str = "/runner/v1",
        *,
        sandbox: Callable[[], Sandbox | None] = lambda: None,
    ) -> None:
        """sandbox(): where freeze runs the venv's pip (envs/layer.py's where), asked at
        each task."""
        self._connection = connection
        self._env_dir = env_dir
        self._sandbox = sandbox
        self._api = api
        self._seen: set[int] = set()
        self._lock = threading.Lock()

    def handle(self, tasks: object) -> list[threading.Thread]:
        started = []
        for item in tasks if isinstance(tasks, list) else []:
            try:
                task_id, kind = int(item["id"]), str(item["kind"])
            except (KeyError, TypeError, ValueError):
                log.error("ignoring a malformed task from the server: %r", item)
                continue
            if kind != SNAPSHOT_TASK:
                continue  # runners ignore kinds they do not know
            with self._lock:
                if task_id in self._seen:
                    continue
                self._seen.add(task_id)
            thread = threading.Thread(
                target=self._snapshot, args=(task_id,), name=f"task-{task_id}", daemon=True
            )
            thread.start()
            started.append(thread)
        return started

    def _snapshot(self, task_id: int) -> None:
        body: dict[str, object]
        try:
            body = {"packages": freeze(self._env_dir, sandbox=self._sandbox())}
        except RuntimeError as exc:
            body = {"error": str(exc)}
        try:
            self._connection.call("POST", f"{self._api}/tasks/{task_id}/result", json=body)
        except Exception:
            log.exception("the answer to task %d was not delivered", task_id)
            with self._lock:
                self._seen.discard(task_id)  # the next poll lists it again
