"""Notifications by webhook: a real local HTTP server receives signed JSON; failures are
retried with backoff and given up after the last attempt; run ends notify their owner."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import select

from factories import Caller, RunnerDouble
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import NotificationDelivery
from gpulease.server.reconcilers import notify
from gpulease.server.runtime import Runtime
from gpulease.server.services import notification_delivery
from gpulease.server.settings import Settings


@dataclass
class Hook:
    """A webhook receiver: answers each POST with the next queued status (then 200)."""

    url: str
    statuses: list[int] = field(default_factory=list)
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


@pytest.fixture
def hook() -> Iterator[Hook]:
    state = Hook(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            status = state.statuses.pop(0) if state.statuses else 200
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/gpulease"
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(
        home=tmp_path / "home",
        database_url=database_url,
        simulated_gpus="A100-80GB:2",
        admin_password="admin-password-1",
        signup_credit="10.00",
        notify_max_attempts=3,
        notify_timeout_s=5,
        webhook_allow_private=True,  # the receiver listens on loopback
    )


def set_webhook(user: Caller, url: str, **more: object) -> str:
    r = user.put("/api/v1/notifications/channels", json={"webhook_url": url, **more})
    assert r.status_code == 200, r.text
    secret = r.json()["webhook_secret"]
    assert secret and secret.startswith("whsec_")
    return str(secret)


def deliveries(rt: Runtime) -> list[NotificationDelivery]:
    with transaction(rt.sessions) as session:
        return list(session.scalars(select(NotificationDelivery).order_by(NotificationDelivery.id)))


def test_webhook_gets_json_signed_with_the_current_secret(
    ann: Caller, rt: Runtime, hook: Hook
) -> None:
    old = set_webhook(ann, hook.url)
    r = ann.put("/api/v1/notifications/channels", json={"rotate_secret": True})
    secret = r.json()["webhook_secret"]
    assert secret and secret != old
    assert ann.post("/api/v1/notifications/channels/test").status_code == 202
    assert notify.tick(rt) == 1
    [(headers, body)] = hook.received
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["x-gpulease-signature"], expected)
    assert headers["x-gpulease-signature"] == notification_delivery.signature(secret, body)
    assert headers["content-type"] == "application/json" and headers["x-gpulease-event"] == "test"
    payload = json.loads(body)
    assert payload["kind"] == "test" and payload["user"] == "ann"
    assert "your channel works" in payload["message"]
    [done] = deliveries(rt)
    assert done.status == "delivered" and done.attempts == 1 and done.delivered_at is not None
    assert notify.tick(rt) == 0 and len(hook.received) == 1  # sent once
    # the secret is shown once; later reads show only a hint of it
    shown = ann.get("/api/v1/notifications/channels").json()
    assert shown["webhook"]["url"] == hook.url and shown["webhook_secret"] is None
    assert shown["webhook"]["secret_hint"] == "…" + secret[-4:]


def test_a_500_is_retried_after_a_backoff_then_delivered(
    ann: Caller, rt: Runtime, hook: Hook
) -> None:
    set_webhook(ann, hook.url)
    hook.statuses = [500]
    ann.post("/api/v1/notifications/channels/test")
    assert notify.tick(rt) == 0
    [waiting] = deliveries(rt)
    assert waiting.status == "pending" and waiting.attempts == 1
    assert waiting.last_error == "the webhook answered HTTP 500"
    assert waiting.next_attempt_at > utcnow() + timedelta(seconds=20)
    assert notify.tick(rt) == 0 and len(hook.received) == 1  # not due yet
    assert notify.tick(rt, now=utcnow() + timedelta(minutes=1)) == 1
    [done] = deliveries(rt)
    assert done.status == "delivered" and done.attempts == 2 and done.last_error == ""
    assert len(hook.received) == 2 and hook.received[0][1] == hook.received[1][1]


def test_delivery_gives_up_after_the_last_attempt(ann: Caller, rt: Runtime, hook: Hook) -> None:
    set_webhook(ann, hook.url)
    hook.statuses = [503, 503, 503, 503]
    ann.post("/api/v1/notifications/channels/test")
    later = utcnow()
    for _ in range(4):
        later += timedelta(hours=2)
        notify.tick(rt, now=later)
    assert len(hook.received) == 3  # notify_max_attempts
    [given_up] = deliveries(rt)
    assert given_up.status == "failed" and given_up.attempts == 3
    assert given_up.last_error == "gave up after 3 attempts: the webhook answered HTTP 503"


def test_an_unreachable_webhook_records_why(ann: Caller, rt: Runtime, hook: Hook) -> None:
    set_webhook(ann, "http://127.0.0.1:9/nothing-listens-here")
    ann.post("/api/v1/notifications/channels/test")
    notify.tick(rt)
    [waiting] = deliveries(rt)
    assert waiting.status == "pending" and "could not reach the webhook" in waiting.last_error


def test_a_leased_delivery_is_not_claimed_twice(ann: Caller, rt: Runtime, hook: Hook) -> None:
    set_webhook(ann, hook.url)
    ann.post("/api/v1/notifications/channels/test")
    now = utcnow()
    with transaction(rt.sessions) as session:
        first = notification_delivery.claim(session, rt.settings, now)
    with transaction(rt.sessions) as session:
        second = notification_delivery.claim(session, rt.settings, now)
    assert len(first) == 1 and second == []
    # a server that lost its lease (expired, taken over) cannot record over the new holder
    later = now + timedelta(hours=1)
    with transaction(rt.sessions) as session:
        [taken] = notification_delivery.claim(session, rt.settings, later)
        assert not notification_delivery.record(session, first[0], None, later, 3)
        assert notification_delivery.record(session, taken, None, later, 3)


def test_removed_webhook_is_not_sent_to(ann: Caller, rt: Runtime, hook: Hook) -> None:
    set_webhook(ann, hook.url)
    ann.post("/api/v1/notifications/channels/test")
    r = ann.put("/api/v1/notifications/channels", json={"webhook_url": None})
    assert r.status_code == 200 and r.json()["webhook"] is None
    notify.tick(rt)
    assert hook.received == []
    [closed] = deliveries(rt)
    assert closed.status == "failed" and "turned off or removed" in closed.last_error
    assert ann.post("/api/v1/notifications/channels/test").status_code == 422


def running_instance(
    owner: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> RunnerDouble:
    r = owner.post("/api/v1/instances", json={"gpu": "A100-80GB:1", "name": "cats"})
    assert r.status_code == 201, r.text
    tick()
    runner = runner_for(int(r.json()["id"]))
    runner.ready()
    return runner


def test_run_finished_and_failed_notify_console_and_webhook(
    ann: Caller,
    rt: Runtime,
    hook: Hook,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    set_webhook(ann, hook.url, webhook_kinds=["runs"])
    runner = running_instance(ann, tick, runner_for)
    ok = ann.post("/api/v1/instances/cats/runs", json={"command": "python train.py"}).json()
    runner.run(ok["id"], ["epoch 1"], exit_code=0)
    bad = ann.post("/api/v1/instances/cats/runs", json={"command": "python eval.py"}).json()
    runner.run(bad["id"], ["Traceback"], exit_code=3)
    found = ann.get("/api/v1/notifications").json()
    by_kind = {n["kind"]: n for n in found}
    assert by_kind["run_finished"]["message"] == (
        f"run {ok['id']} on cats succeeded (exit code 0): python train.py"
    )
    assert by_kind["run_failed"]["message"] == (
        f"run {bad['id']} on cats failed (exit code 3): python eval.py"
    )
    notify.tick(rt)
    sent = [json.loads(body) for _, body in hook.received]
    assert sorted(p["kind"] for p in sent) == ["run_failed", "run_finished"]  # runs only
    # marking read
    r = ann.post(f"/api/v1/notifications/{by_kind['run_failed']['id']}/read")
    assert r.status_code == 200 and r.json()["read_at"] is not None


def test_channels_refuse_bad_input(ann: Caller, rt: Runtime) -> None:
    for url in ("ftp://example.com/x", "not a url", "http://", "javascript:alert(1)"):
        r = ann.put("/api/v1/notifications/channels", json={"webhook_url": url})
        assert r.status_code == 422, url
        assert "http:// or https://" in r.json()["detail"]
    r = ann.put("/api/v1/notifications/channels", json={"rotate_secret": True})
    assert r.status_code == 422 and "set a webhook URL first" in r.json()["detail"]
    r = ann.put(
        "/api/v1/notifications/channels",
        json={"webhook_url": "https://example.com/h", "webhook_kinds": ["runs", "weather"]},
    )
    assert r.status_code == 422 and "unknown notification categories weather" in r.json()["detail"]
    r = ann.put("/api/v1/notifications/channels", json={"email": "not-an-address"})
    assert r.status_code == 422 and "not an email address" in r.json()["detail"]
    # nothing was half-applied by the refusals
    assert ann.get("/api/v1/notifications/channels").json()["webhook"] is None
    # test sends are rate-limited
    set_webhook(ann, "https://example.com/h")
    assert ann.post("/api/v1/notifications/channels/test").status_code == 202
    again = ann.post("/api/v1/notifications/channels/test")
    assert again.status_code == 409 and "try again" in again.json()["detail"]


def test_another_users_notification_is_not_found(ann: Caller, bob: Caller) -> None:
    ann.put("/api/v1/notifications/channels", json={"webhook_url": "https://example.com/h"})
    ann.post("/api/v1/notifications/channels/test")
    [mine] = ann.get("/api/v1/notifications").json()
    r = bob.post(f"/api/v1/notifications/{mine['id']}/read")
    assert r.status_code == 404 and "you have no notification" in r.json()["detail"]
    assert bob.get("/api/v1/notifications/channels").json()["webhook"] is None


def test_a_running_server_delivers_on_its_own(settings: Settings, rt: Runtime) -> None:
    """The reconciler thread starts the delivery thread: no test drives it here."""
    from starlette.testclient import TestClient

    from factories import make_user
    from gpulease.server.app import create_app

    arrived = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(204)
            self.end_headers()
            arrived.set()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with TestClient(create_app(settings, runtime=rt, reconcilers=True)) as http:
            ann = make_user(http, "ann")
            set_webhook(ann, f"http://127.0.0.1:{server.server_address[1]}/")
            ann.post("/api/v1/notifications/channels/test")
            assert arrived.wait(30), "the delivery thread never sent the test notification"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
