"""Webhooks cannot be aimed at the server itself, its network or a metadata service: refused
with a 422 when saved and again, after a fresh resolution, at delivery."""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import select

from factories import Caller
from gpulease.server.db import transaction
from gpulease.server.orm import NotificationDelivery
from gpulease.server.reconcilers import notify
from gpulease.server.runtime import Runtime
from gpulease.server.services import webhook_addresses

REFUSED = [
    "http://127.0.0.1:8420/api/v1/tokens",
    "http://127.1:22/",
    "http://localhost:5432/",
    "http://app.localhost/",
    "http://localhost./",
    "http://2130706433/",  # 127.0.0.1 as one number
    "http://0x7f.1/",
    "http://[::1]:8420/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:10.0.0.1]/",
    "http://10.1.2.3/",
    "http://172.16.0.9/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/",
    "http://[fd12:3456::1]/",
    "http://[fd00:ec2::254]/",
    "http://0.0.0.0:8420/",
    "http://[::]/",
    "http://224.0.0.1/",
    "http://[ff02::1]/",
    "http://[64:ff9b::a00:1]/",  # NAT64 of 10.0.0.1
    "http://[2002:7f00:1::]/",  # 6to4 of 127.0.0.1
]


def put_webhook(user: Caller, url: str) -> tuple[int, str]:
    r = user.put("/api/v1/notifications/channels", json={"webhook_url": url})
    return r.status_code, str(r.json().get("detail", ""))


@pytest.mark.parametrize("url", REFUSED)
def test_loopback_private_link_local_and_metadata_targets_are_refused(
    ann: Caller, url: str
) -> None:
    status, detail = put_webhook(ann, url)
    assert status == 422, (url, detail)
    assert "webhooks cannot be sent to" in detail and "public address" in detail
    assert ann.get("/api/v1/notifications/channels").json()["webhook"] is None


def test_a_name_that_resolves_to_a_private_address_is_refused(
    ann: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake_dns(host: str, port: int) -> list[str]:
        return ["10.9.8.7"]

    monkeypatch.setattr(webhook_addresses, "lookup", fake_dns)
    status, detail = put_webhook(ann, "https://hooks.internal.example/x")
    assert status == 422
    assert "hooks.internal.example (10.9.8.7)" in detail and "private" in detail
    # public names and literals are accepted
    assert put_webhook(ann, "https://93.184.215.14/h")[0] == 200
    assert put_webhook(ann, "https://[2606:4700::1111]/h")[0] == 200


def test_addresses_by_kind() -> None:
    def why(text: str, allow: bool = False) -> str | None:
        return webhook_addresses.why_refused(ipaddress.ip_address(text), allow_private=allow)

    assert why("8.8.8.8") is None and why("2606:4700::1111") is None
    assert why("127.0.0.1") == "a loopback address (this server itself)"
    assert why("::1") == "a loopback address (this server itself)"
    assert why("10.0.0.1", allow=True) is None and why("::1", allow=True) is None
    # never, whatever the operator allows
    assert why("169.254.169.254", allow=True) == "a cloud metadata address"
    assert why("::ffff:169.254.169.254", allow=True) == "a cloud metadata address"
    assert why("0.0.0.0", allow=True) == "an unspecified address"
    assert why("239.1.1.1", allow=True) == "a multicast address"


@pytest.fixture
def receiver() -> Iterator[tuple[int, list[str]]]:
    """A webhook receiver on loopback: (port, Host headers it was sent)."""
    hosts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            hosts.append(self.headers.get("Host", ""))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1]), hosts
    server.shutdown()
    server.server_close()
    thread.join()


def last_delivery(rt: Runtime) -> NotificationDelivery:
    with transaction(rt.sessions) as session:
        row = session.scalars(
            select(NotificationDelivery).order_by(NotificationDelivery.id.desc())
        ).first()
        assert row is not None
        return row


def test_a_name_that_turns_private_after_saving_is_not_called(
    ann: Caller,
    rt: Runtime,
    receiver: tuple[int, list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DNS rebinding: public when saved, loopback at delivery. Nothing is sent, and the user
    reads a refusal, not what the port answered."""
    port, hosts = receiver
    answers = iter(["93.184.215.14", "127.0.0.1"])

    def fake_dns(host: str, p: int) -> list[str]:
        return [next(answers)]

    monkeypatch.setattr(webhook_addresses, "lookup", fake_dns)
    assert put_webhook(ann, f"http://hooks.example.net:{port}/h")[0] == 200
    assert ann.post("/api/v1/notifications/channels/test").status_code == 202
    notify.tick(rt)
    assert hosts == []
    error = last_delivery(rt).last_error
    assert error.startswith("could not deliver: webhooks cannot be sent to hooks.example.net")


def test_an_allowed_name_is_called_at_the_address_checked_with_its_own_host(
    ann: Caller,
    rt: Runtime,
    receiver: tuple[int, list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port, hosts = receiver
    rt.settings.webhook_allow_private = True
    calls: list[str] = []

    def fake_dns(host: str, p: int) -> list[str]:
        calls.append(host)
        return ["127.0.0.1"]

    monkeypatch.setattr(webhook_addresses, "lookup", fake_dns)
    assert put_webhook(ann, f"http://hooks.intranet.test:{port}/h")[0] == 200
    assert ann.post("/api/v1/notifications/channels/test").status_code == 202
    notify.tick(rt)
    assert last_delivery(rt).status == "delivered", last_delivery(rt).last_error
    assert hosts == [f"hooks.intranet.test:{port}"]
    assert calls == ["hooks.intranet.test", "hooks.intranet.test"]  # saved, then delivered


def test_unreachable_ports_all_read_the_same(
    ann: Caller, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed port tells the user no more than 'could not deliver'."""
    rt.settings.webhook_allow_private = True
    assert put_webhook(ann, "http://127.0.0.1:9/")[0] == 200
    ann.post("/api/v1/notifications/channels/test")
    notify.tick(rt)
    error = last_delivery(rt).last_error
    assert error.startswith("could not deliver") and "Errno" not in error and ":9" not in error
