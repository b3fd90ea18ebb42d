"""The console shows a run's own command, not the script a task file's setup wraps it in."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from factories import BrowserFactory, Caller, RunnerDouble, logged_in, make_running_instance
from gpulease.core.taskspec import TaskSpec


@pytest.mark.parametrize("skypilot", [True, False])
def test_run_page_and_dashboard_show_the_tasks_own_command(
    skypilot: bool,
    ann: Caller,
    browser: BrowserFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    make_running_instance(ann, tick, runner_for, "cats")
    spec = TaskSpec(run="python train.py --epochs 3", setup="pip list", skypilot=skypilot)
    r = ann.post("/api/v1/instances/cats/runs", json={"command": spec.script()})
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    # the server keeps the whole script: it is what runs
    assert ann.get(f"/api/v1/runs/{run_id}").json()["command"] == spec.script()

    client = logged_in(browser, "ann")
    for url in (f"/runs/{run_id}", "/"):
        page = client.get(url)
        assert page.status_code == 200
        assert "python train.py --epochs 3" in page.text, url
        assert "set -e" not in page.text and "exec bash -c" not in page.text, url
        assert "pip list" not in page.text, url


def test_the_run_ended_notification_names_the_tasks_own_command(
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    _, runner = make_running_instance(ann, tick, runner_for, "dogs")
    spec = TaskSpec(run="python train.py --epochs 3", setup="pip list", skypilot=True)
    run_id = ann.post("/api/v1/instances/dogs/runs", json={"command": spec.script()}).json()["id"]
    assert runner.call("POST", f"/runs/{run_id}/started", json={"pid": 3}).status_code == 204
    assert runner.call("POST", f"/runs/{run_id}/exit", json={"exit_code": 2}).status_code == 204
    (note,) = [n for n in ann.get("/api/v1/notifications").json() if n["kind"] == "run_failed"]
    assert (
        note["message"] == f"run {run_id} on dogs failed (exit code 2): python train.py --epochs 3"
    )
