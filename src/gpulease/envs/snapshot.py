"""The runner's snapshot_env task: `pip freeze` of an instance's venv, posted to the server."""

from __future__ import annotations

import logging
import subprocess
import threading
from pathlib import Path
from typing import Any, Protocol

from gpulease.envs.build import env_python

log = logging.getLogger(__name__)

SNAPSHOT_TASK = "snapshot_env"
FREEZE_TIMEOUT_S = 120.0


class _Caller(Protocol):
    def call(self, method: str, path: str, *, json: Any = None) -> Any: ...


def freeze(env_dir: Path, timeout: float = FREEZE_TIMEOUT_S) -> list[str]:
    """`pip freeze` of the venv at env_dir, one requirement per line. Raises RuntimeError
    with pip's message when it fails."""
    try:
        done = subprocess.run(
            [str(env_python(env_dir)), "-m", "pip", "freeze", "--disable-pip-version-check"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={"PATH": "/usr/bin:/bin", "PIP_NO_INPUT": "1"},
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"pip freeze could not run: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise RuntimeError(f"pip freeze failed with exit code {done.returncode}: {tail}")
    return [line for line in done.stdout.splitlines() if line.strip()]


class TaskRunner:
    """Runs each task the server lists once (the long poll repeats a task until answered),
    in a thread of its own so a slow pip never holds up runs."""

    def __init__(self, connection: _Caller, env_dir: Path, api: str = "/runner/v1") -> None:
        self._connection = connection
        self._env_dir = env_dir
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
            body = {"packages": freeze(self._env_dir)}
        except RuntimeError as exc:
            body = {"error": str(exc)}
        try:
            self._connection.call("POST", f"{self._api}/tasks/{task_id}/result", json=body)
        except Exception:
            log.exception("the answer to task %d was not delivered", task_id)
            with self._lock:
                self._seen.discard(task_id)  # the next poll lists it again
