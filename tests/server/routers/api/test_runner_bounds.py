"""A runner's numbers out of range (a hostile job holding a runner token sends anything) are
a 422 naming the field, never an overflow in the database or in datetime."""

from __future__ import annotations

from collections.abc import Callable

from starlette.testclient import TestClient

from factories import Caller, RunnerDouble, make_running_instance

HUGE = 2**64


def _chunk(**change: object) -> dict[str, object]:
    return {"chunks": [{"seq": 0, "stream": "stdout", "data": "x", "time": 1.7e9, **change}]}


REFUSED = [
    ("logs", _chunk(seq=HUGE), "chunks.0.seq"),
    ("logs", _chunk(seq=-1), "chunks.0.seq"),
    ("logs", _chunk(time=1e300), "chunks.0.time"),
    ("exit", {"exit_code": HUGE}, "exit_code"),
    ("exit", {"exit_code": -HUGE}, "exit_code"),
]


def test_out_of_range_runner_numbers_are_refused(
    http: TestClient,
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, "bounds")
    run = ann.post(f"/api/v1/instances/{instance_id}/runs", json={"command": "true"}).json()
    for path, body, field in REFUSED:
        r = runner.call("POST", f"/runs/{run['id']}/{path}", json=body)
        assert r.status_code == 422 and field in r.json()["detail"], (path, body, r.text)
    # the same calls in range are taken
    assert runner.call("POST", f"/runs/{run['id']}/logs", json=_chunk()).status_code == 204
    r = runner.call("POST", f"/runs/{run['id']}/exit", json={"exit_code": -9})
    assert r.status_code == 204
