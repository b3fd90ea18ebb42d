"""A run carries its task's name: stored from the API, refused when it is not one printable
line of bounded length, shown on the run page, the dashboard and the run-ended notice."""

from __future__ import annotations

from collections.abc import Callable

from factories import BrowserFactory, Caller, RunnerDouble, logged_in, make_running_instance
from gpulease.server.services.runs import MAX_TASK_NAME


def test_a_runs_task_name_round_trips_and_is_shown(
    ann: Caller,
    browser: BrowserFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    _, runner = make_running_instance(ann, tick, runner_for, "cats")
    body = {"command": "python train.py", "task_name": "  Cat Breeds <v2>  "}
    r = ann.post("/api/v1/instances/cats/runs", json=body)
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    assert r.json()["task_name"] == "Cat Breeds <v2>"  # trimmed
    assert ann.get(f"/api/v1/runs/{run_id}").json()["task_name"] == "Cat Breeds <v2>"
    plain = ann.post("/api/v1/instances/cats/runs", json={"command": "true", "task_name": " "})
    assert plain.status_code == 201 and plain.json()["task_name"] is None

    client = logged_in(browser, "ann")
    for url in (f"/runs/{run_id}", "/"):
        page = client.get(url)
        assert page.status_code == 200
        assert "Cat Breeds &lt;v2&gt;" in page.text, url  # escaped, as any job's text

    assert runner.call("POST", f"/runs/{run_id}/started", json={"pid": 3}).status_code == 204
    assert runner.call("POST", f"/runs/{run_id}/exit", json={"exit_code": 0}).status_code == 204
    (note,) = [n for n in ann.get("/api/v1/notifications").json() if n["kind"] == "run_finished"]
    assert note["message"] == (
        f"run {run_id} (task 'Cat Breeds <v2>') on cats succeeded (exit code 0): python train.py"
    )


def test_a_bad_task_name_is_refused_with_the_reason(
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    make_running_instance(ann, tick, runner_for, "dogs")
    for name, says in [
        ("x" * (MAX_TASK_NAME + 1), f"longer than {MAX_TASK_NAME} characters"),
        ("two\nlines", r"contains '\n'"),
        ("bell\x07", r"contains '\x07'"),
    ]:
        r = ann.post("/api/v1/instances/dogs/runs", json={"command": "true", "task_name": name})
        assert r.status_code == 422, r.text
        assert says in r.json()["detail"], name
    assert ann.get("/api/v1/runs").json() == []  # nothing was created
