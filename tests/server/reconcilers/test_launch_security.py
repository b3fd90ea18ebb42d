"""What the launcher tells runners about isolation and TLS: sandbox on, the certificate to trust."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from factories import Caller, make_settings
from gpulease.backends.base import RunnerSpec
from gpulease.backends.fake import FakeBackend
from gpulease.server.runner_socket import bind_socket, socket_path
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


@pytest.mark.parametrize(
    ("same_host", "listening", "expected"),
    [(True, True, True), (True, False, False), (False, True, False)],
    ids=["same-host", "nobody-listens", "remote-backend"],
)
def test_runners_on_this_host_get_the_servers_unix_socket(
    settings: Settings,
    ann: Caller,
    tick: Callable[[], None],
    backend: FakeBackend,
    same_host: bool,
    listening: bool,
    expected: bool,
) -> None:
    """The runner socket goes to runners of a same-host backend while the server listens on
    it; otherwise they keep TCP (a remote node cannot reach it, and nothing would answer)."""
    backend.same_host = same_host
    path = socket_path(settings)
    listener = bind_socket(path)
    if listening:
        listener.listen()
    try:
        ann.post("/api/v1/instances", json={"gpu": "T4:1"})
        tick()
        (spec,) = backend.started
        assert spec.server_socket == (path if expected else None)
        assert RunnerSpec.from_json(spec.to_json()) == spec
    finally:
        listener.close()
