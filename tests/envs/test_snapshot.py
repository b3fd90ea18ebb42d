"""The runner's snapshot_env task: a real `pip freeze`, answered once per task."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gpulease.envs.snapshot import TaskRunner, freeze

VENV = Path(sys.prefix)


def test_freeze_lists_the_venvs_packages() -> None:
    lines = freeze(VENV)
    assert any(line.lower().startswith("httpx==") for line in lines)


def test_freeze_of_a_missing_venv_says_why(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="pip freeze could not run"):
        freeze(tmp_path / "nothing")


class Recorder:
    def __init__(self, fail_first: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail_first = fail_first
        self.lock = threading.Lock()

    def call(self, method: str, path: str, **kw: Any) -> Any:
        with self.lock:
            if self.fail_first:
                self.fail_first = False
                raise ConnectionError("server away")
            self.calls.append((path, kw["json"]))


def test_each_task_runs_once_and_unknown_kinds_are_ignored(tmp_path: Path) -> None:
    connection = Recorder()
    tasks = TaskRunner(connection, tmp_path / "missing-venv")
    listed = [{"id": 7, "kind": "snapshot_env"}, {"id": 8, "kind": "later"}, {"bad": 1}]

    for thread in tasks.handle(listed) + tasks.handle(listed):
        thread.join(30)

    ((path, body),) = connection.calls
    assert path == "/runner/v1/tasks/7/result"
    assert "pip freeze could not run" in body["error"]


def test_an_undelivered_answer_is_retried_at_the_next_poll(tmp_path: Path) -> None:
    connection = Recorder(fail_first=True)
    tasks = TaskRunner(connection, tmp_path / "missing-venv")
    for thread in tasks.handle([{"id": 3, "kind": "snapshot_env"}]):
        thread.join(30)
    assert connection.calls == []
    for thread in tasks.handle([{"id": 3, "kind": "snapshot_env"}]):
        thread.join(30)
    assert [path for path, _ in connection.calls] == ["/runner/v1/tasks/3/result"]
