"""Server fixtures: a runtime on a fake backend with simulated GPUs, the ASGI app, users."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from factories import Caller, login_admin, make_settings, make_user
from gpulease.backends.fake import FakeBackend
from gpulease.server.app import create_app
from gpulease.server.runtime import Runtime, build_runtime
from gpulease.server.settings import Settings


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return make_settings(tmp_path / "home", database_url)


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def rt(settings: Settings, backend: FakeBackend) -> Iterator[Runtime]:
    runtime = build_runtime(settings, backend)
    yield runtime
    runtime.engine.dispose()


@pytest.fixture
def http(settings: Settings, rt: Runtime) -> Iterator[TestClient]:
    app = create_app(settings, runtime=rt, reconcilers=False)
    with TestClient(app) as client:
        yield client


@pytest.fixture
def ann(http: TestClient) -> Caller:
    return make_user(http, "ann")


@pytest.fixture
def bob(http: TestClient) -> Caller:
    return make_user(http, "bob")


@pytest.fixture
def admin(http: TestClient) -> Caller:
    return login_admin(http)


@pytest.fixture
def tick(rt: Runtime):  # type: ignore[no-untyped-def]
    """Run the reconcilers once, as the server's loop does every second."""
    from gpulease.server.reconcilers.loop import run_once

    return lambda: run_once(rt)


@pytest.fixture
def runner_for(http: TestClient, backend: FakeBackend):  # type: ignore[no-untyped-def]
    """runner_for(instance_id) -> a RunnerDouble holding the token its backend received."""
    from factories import RunnerDouble

    def find(instance_id: int) -> RunnerDouble:
        handle = backend.handle_for(instance_id)
        assert handle is not None, f"no runner was started for instance {instance_id}"
        return RunnerDouble(http, backend.runners[handle].spec.token)

    return find
