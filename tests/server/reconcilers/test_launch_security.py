"""What the launcher tells runners about isolation and TLS: sandbox on, the certificate to trust."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from factories import Caller, make_settings
from gpulease.backends.base import RunnerSpec
from gpulease.backends.fake import FakeBackend
from gpulease.server.settings import Settings


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return make_settings(
        tmp_path / "home", database_url, simulated_gpus="T4:1", tls_self_signed=True
    )


def test_runners_get_the_sandbox_and_exactly_the_servers_certificate(
    settings: Settings, ann: Caller, tick: Callable[[], None], backend: FakeBackend
) -> None:
    created = ann.post("/api/v1/instances", json={"gpu": "T4:1"})
    assert created.status_code == 201, created.text
    tick()
    handle = backend.handle_for(created.json()["id"])
    assert handle is not None
    spec = backend.runners[handle].spec

    assert spec.sandbox is True
    assert spec.server_url.startswith("https://")
    assert spec.server_certificate == (settings.tls_path / "cert.pem").read_text()
    assert RunnerSpec.from_json(spec.to_json()) == spec
