"""Support tickets over the API: open one with a run's log attached, admins answer, both
sides are notified, nobody else can reach them, and bad input gets a clear refusal."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from factories import Caller, RunnerDouble


@pytest.fixture
def failed_run(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> int:
    r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1", "name": "cats"})
    assert r.status_code == 201, r.text
    tick()
    runner = runner_for(int(r.json()["id"]))
    runner.ready()
    run = ann.post("/api/v1/instances/cats/runs", json={"command": "python train.py"}).json()
    runner.run(run["id"], [f"line {i}" for i in range(250)] + ["CUDA error: oops"], exit_code=1)
    return int(run["id"])


def kinds(user: Caller) -> list[str]:
    return [n["kind"] for n in user.get("/api/v1/notifications").json()]


def test_open_with_log_admin_reply_and_close(ann: Caller, admin: Caller, failed_run: int) -> None:
    r = ann.post(
        "/api/v1/support/tickets",
        json={
            "subject": "training dies",
            "body": "my run fails with a CUDA error",
            "run_id": failed_run,
            "attach_log": True,
        },
    )
    assert r.status_code == 201, r.text
    ticket = r.json()
    assert ticket["status"] == "open" and ticket["instance"] == "cats"
    assert ticket["run_id"] == failed_run and ticket["owner"] == "ann"
    [first] = ticket["messages"]
    excerpt = first["log_excerpt"].splitlines()
    assert len(excerpt) == 200 and excerpt[-1] == "CUDA error: oops" and excerpt[0] == "line 51"
    assert "ticket_opened" in kinds(admin)

    listed = admin.get("/api/v1/support/tickets").json()
    assert [t["id"] for t in listed] == [ticket["id"]]  # admins see everyone's
    r = admin.post(
        f"/api/v1/support/tickets/{ticket['id']}/messages",
        json={"body": "update the driver, then retry"},
    )
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "answered"
    assert r.json()["messages"][-1]["author_is_admin"] is True
    reply = [n for n in ann.get("/api/v1/notifications").json() if n["kind"] == "ticket_reply"]
    assert len(reply) == 1 and "update the driver" in reply[0]["message"]

    r = ann.post(f"/api/v1/support/tickets/{ticket['id']}/messages", json={"body": "thanks"})
    assert r.json()["status"] == "open" and kinds(admin).count("ticket_message") == 1
    r = ann.post(f"/api/v1/support/tickets/{ticket['id']}/close")
    assert r.status_code == 200 and r.json()["status"] == "closed"
    assert r.json()["closed_at"] is not None
    shown = ann.get(f"/api/v1/support/tickets/{ticket['id']}").json()
    assert [m["body"] for m in shown["messages"]] == [
        "my run fails with a CUDA error",
        "update the driver, then retry",
        "thanks",
    ]


def test_another_users_ticket_is_not_found(ann: Caller, bob: Caller, failed_run: int) -> None:
    ticket = ann.post("/api/v1/support/tickets", json={"subject": "help", "body": "please"}).json()
    for method, path, body in (
        ("GET", f"/api/v1/support/tickets/{ticket['id']}", None),
        ("POST", f"/api/v1/support/tickets/{ticket['id']}/messages", {"body": "hi"}),
        ("POST", f"/api/v1/support/tickets/{ticket['id']}/close", None),
    ):
        r = bob.http.request(method, path, headers=bob.headers, json=body)
        assert r.status_code == 404, path
        assert "you have no support ticket" in r.json()["detail"]
    assert bob.get("/api/v1/support/tickets").json() == []
    # nor can bob attach ann's run (or its log) to his own ticket
    r = bob.post(
        "/api/v1/support/tickets",
        json={"subject": "x", "body": "y", "run_id": failed_run, "attach_log": True},
    )
    assert r.status_code == 422 and f"you have no run {failed_run}" in r.json()["detail"]
    r = bob.post("/api/v1/support/tickets", json={"subject": "x", "body": "y", "instance": "cats"})
    assert r.status_code == 422 and "you have no instance 'cats'" in r.json()["detail"]


def test_bad_input_is_refused_clearly(ann: Caller, failed_run: int) -> None:
    cases = [
        ({"subject": "s", "body": "   "}, "the message is empty"),
        ({"subject": "s", "body": "x" * 10_001}, "keep it under 10,000"),
        ({"subject": "  ", "body": "b"}, "give the ticket a subject"),
        ({"subject": "s", "body": "b", "run_id": 999999}, "you have no run 999999"),
        ({"subject": "s", "body": "b", "attach_log": True}, "attach_log needs a run"),
    ]
    for body, message in cases:
        r = ann.post("/api/v1/support/tickets", json=body)
        assert r.status_code == 422, body
        assert message in r.json()["detail"]
    r = ann.post("/api/v1/support/tickets", json={"subject": "s"})
    assert r.status_code == 422 and "the message is empty" in r.json()["detail"]
    ticket = ann.post("/api/v1/support/tickets", json={"subject": "s", "body": "b"}).json()
    r = ann.post(f"/api/v1/support/tickets/{ticket['id']}/messages", json={"body": ""})
    assert r.status_code == 422 and "the message is empty" in r.json()["detail"]
    assert ann.get("/api/v1/support/tickets/abc").status_code == 422
