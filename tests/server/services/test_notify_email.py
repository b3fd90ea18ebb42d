"""Notifications by email: a real local SMTP server (aiosmtpd) receives them when SMTP is
configured; without SMTP no email is queued or attempted."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from sqlalchemy import select

from factories import Caller, make_settings
from gpulease.server.db import transaction
from gpulease.server.orm import NotificationChannel, NotificationDelivery
from gpulease.server.reconcilers import notify
from gpulease.server.runtime import Runtime
from gpulease.server.settings import Settings


class Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[list[str], Message]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.messages.append((list(envelope.rcpt_tos), message_from_bytes(envelope.content)))
        return "250 OK"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, int]]:
    handler = Inbox()
    controller = Controller(handler, hostname="127.0.0.1", port=free_port())
    controller.start()
    yield handler, controller.port
    controller.stop()


@pytest.fixture
def settings(tmp_path: Path, database_url: str, inbox: tuple[Inbox, int]) -> Settings:
    return make_settings(
        tmp_path / "home",
        database_url,
        simulated_gpus="A100-80GB:2",
        smtp_host="127.0.0.1",
        smtp_port=inbox[1],
        smtp_from="gpulease@example.com",
        smtp_starttls=False,
        notify_timeout_s=5,
    )


def test_email_arrives_with_subject_and_body(
    ann: Caller, rt: Runtime, inbox: tuple[Inbox, int]
) -> None:
    r = ann.put("/api/v1/notifications/channels", json={"email": "ann@example.com"})
    assert r.status_code == 200, r.text
    assert r.json()["email"] == {"address": "ann@example.com", "enabled": True, "kinds": None}
    assert r.json()["email_available"] is True
    ann.post("/api/v1/notifications/channels/test")
    assert notify.tick(rt) == 1
    [(to, message)] = inbox[0].messages
    assert to == ["ann@example.com"]
    assert message["Subject"] == "[gpulease] Test notification"
    assert message["From"] == "gpulease@example.com"
    body = message.get_payload(decode=True)
    assert isinstance(body, bytes)
    assert b"test notification for ann: your channel works" in body
    assert b"/settings/notifications" in body


def test_email_off_sends_nothing(ann: Caller, rt: Runtime, inbox: tuple[Inbox, int]) -> None:
    ann.put("/api/v1/notifications/channels", json={"email": "ann@example.com"})
    ann.put("/api/v1/notifications/channels", json={"email_enabled": False})
    r = ann.post("/api/v1/notifications/channels/test")
    assert r.status_code == 422 and "no channel is on" in r.json()["detail"]
    notify.tick(rt)
    assert inbox[0].messages == []


def test_without_smtp_no_email_is_queued(tmp_path: Path, database_url: str) -> None:
    from starlette.testclient import TestClient

    from factories import make_user
    from gpulease.backends.fake import FakeBackend
    from gpulease.server.app import create_app
    from gpulease.server.runtime import build_runtime

    plain = Settings(
        home=tmp_path / "plain",
        database_url=database_url,
        admin_password="admin-password-1",
        webhook_allow_private=True,  # the webhook below is on loopback
    )
    runtime = build_runtime(plain, FakeBackend())
    try:
        with TestClient(create_app(plain, runtime=runtime, reconcilers=False)) as http:
            ann = make_user(http, "ann")
            r = ann.put("/api/v1/notifications/channels", json={"email": "ann@example.com"})
            assert r.status_code == 409 and "GPULEASE_SMTP_HOST" in r.json()["detail"]
            channels = ann.get("/api/v1/notifications/channels").json()
            assert channels["email"] is None and channels["email_available"] is False
            ann.put("/api/v1/notifications/channels", json={"webhook_url": "http://127.0.0.1:9/"})
            ann.post("/api/v1/notifications/channels/test")
            with transaction(runtime.sessions) as session:
                queued = session.scalars(
                    select(NotificationChannel.kind).join(
                        NotificationDelivery,
                        NotificationDelivery.channel_id == NotificationChannel.id,
                    )
                ).all()
            assert queued == ["webhook"]
    finally:
        runtime.engine.dispose()
