"""POST /instances/{ref}/exec: a run created and followed in one streamed answer."""

from __future__ import annotations

import json
from collections.abc import Callable

from factories import Caller, RunnerDouble, make_running_instance
from gpulease.client.sse import parse_sse


def test_exec_answers_with_its_run_then_the_run_events(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    body = {"command": "echo hi", "env": {"LR": "0.1"}}
    kinds: list[str] = []
    with ann.http.stream(
        "POST", f"/api/v1/instances/{instance_id}/exec", json=body, headers=ann.headers
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        for message in parse_sse(answer.iter_lines()):
            kinds.append(message.event)
            if message.event == "run":
                started = json.loads(message.data)
                assert message.id == "-1:0"
                assert started["instance_status"] == "running"
                run_id = started["run"]["id"]
                (wanted,) = runner.commands()  # the runner's long poll has it at once
                assert wanted == {"id": run_id, "command": "echo hi", "env": {"LR": "0.1"}}
                runner.run(run_id, ["hi"], 3)
            elif message.event == "log":
                assert json.loads(message.data)["data"] == "hi\n"
            elif message.event == "end":
                assert json.loads(message.data) == {"status": "failed", "exit_code": 3}
                break
    assert kinds[0] == "run" and "log" in kinds and "metric" not in kinds
    assert kinds[-1] == "end"


def test_exec_refusals_come_before_the_stream(
    ann: Caller, bob: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    url = f"/api/v1/instances/{instance_id}/exec"
    theirs = bob.post(url, json={"command": "cat /workspace/secret"})
    assert theirs.status_code == 404 and "no instance" in theirs.json()["detail"]
    empty = ann.post(url, json={"command": "  "})
    assert empty.status_code == 422 and "command is empty" in empty.json()["detail"]
    malformed = ann.post(url, json={"env": {"A": "1"}})
    assert malformed.status_code == 422 and "command" in malformed.json()["detail"]
    anonymous = ann.http.post(url, json={"command": "true"})
    assert anonymous.status_code == 401
    assert runner.commands() == []  # none of them made a run
