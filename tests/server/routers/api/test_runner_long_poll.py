"""The runner's /commands long poll: at once when there is something, after `wait` if not."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx

from factories import Caller, RunnerDouble, make_running_instance
from gpulease.server.db import transaction
from gpulease.server.orm import Instance
from gpulease.server.routers.api.runner import MAX_WAIT_S
from gpulease.server.runtime import Runtime


def _poll(runner: RunnerDouble, wait: float) -> tuple[float, httpx.Response]:
    asked = time.monotonic()
    response = runner.call("GET", "/commands", params={"wait": wait})
    return time.monotonic() - asked, response


def test_a_pending_run_answers_the_long_poll_at_once(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    run = ann.post(f"/api/v1/instances/{instance_id}/runs", json={"command": "true"}).json()
    took, response = _poll(runner, MAX_WAIT_S)
    assert response.status_code == 200, response.text
    assert [r["id"] for r in response.json()["runs"]] == [run["id"]]
    assert response.json()["stop"] is False
    assert took < MAX_WAIT_S * 2 / 3  # at once, not at the end of its wait (room for a loaded host)


def test_with_nothing_to_do_the_long_poll_answers_empty_after_its_wait(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    _, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    took, response = _poll(runner, 0.3)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "runs": [],
        "streams": [],
        "tasks": [],
        "stop": False,
        "preempt_grace_s": None,
    }
    assert took >= 0.3


def test_a_stop_answers_a_waiting_long_poll(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    answers: list[tuple[float, httpx.Response]] = []
    poller = threading.Thread(target=lambda: answers.append(_poll(runner, MAX_WAIT_S)))
    poller.start()
    time.sleep(0.3)  # the poll is waiting by now
    assert ann.post(f"/api/v1/instances/{instance_id}/stop").status_code < 300
    poller.join(timeout=MAX_WAIT_S + 10)
    ((took, response),) = answers
    assert response.status_code == 200, response.text
    assert response.json()["stop"] is True
    # woken by the stop, not by the end of its wait (a stop under load took 11 s once)
    assert took < MAX_WAIT_S * 2 / 3


def test_another_users_stop_does_not_reach_this_runner(
    ann: Caller,
    bob: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    _, ann_runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    bob_id, bob_runner = make_running_instance(bob, tick, runner_for)
    assert ann.post(f"/api/v1/instances/{bob_id}/stop").status_code == 404
    assert bob.post(f"/api/v1/instances/{bob_id}/stop").status_code < 300
    assert _poll(bob_runner, 0)[1].json()["stop"] is True
    assert _poll(ann_runner, 0.2)[1].json()["stop"] is False


def test_a_bad_wait_or_an_unknown_token_is_refused(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    _, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    bad = runner.call("GET", "/commands", params={"wait": "soon"})
    assert bad.status_code == 422 and "wait" in bad.text
    stranger = RunnerDouble(runner.http, "glr_" + "x" * 43)
    assert stranger.call("GET", "/commands", params={"wait": 0}).status_code == 401


def test_a_poll_neither_waits_for_a_writer_nor_writes(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    """A writer holds the database (SQLite: its write lock; PostgreSQL: the instance's row)
    for as long as it likes, as a long billing tick may: the runner's poll still answers,
    and leaves the instance as it was (liveness is the heartbeats' to tell)."""
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    with transaction(rt.sessions) as session:
        before = session.get(Instance, instance_id)
        assert before is not None
        seen = before.last_heartbeat_at
    answers: list[tuple[float, httpx.Response]] = []
    poller = threading.Thread(target=lambda: answers.append(_poll(runner, 0)))
    with transaction(rt.sessions) as writer:
        assert writer.get(Instance, instance_id, with_for_update=True) is not None
        poller.start()
        poller.join(timeout=10)
        answered = list(answers)  # what came back while the writer held on
    poller.join(timeout=60)
    assert answered, "the poll waited for the writer"
    assert answered[0][1].status_code == 200, answered[0][1].text
    with transaction(rt.sessions) as session:
        after = session.get(Instance, instance_id)
        assert after is not None and after.last_heartbeat_at == seen
