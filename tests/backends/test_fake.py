"""The fake backend keeps to the Backend contract that server tests rely on."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulease.backends.base import Backend, RunnerSpec
from gpulease.backends.fake import FakeBackend
from gpulease.core.templates import get_template


def spec(instance_id: int) -> RunnerSpec:
    return RunnerSpec(
        instance_id=instance_id,
        server_url="http://test",
        token=f"t{instance_id}",
        workspace=Path("/ws"),
        run_dir=Path("/run"),
        env_cache=Path("/envs"),
        template=get_template("python"),
    )


def test_fake_backend_records_and_plays_liveness() -> None:
    fake = FakeBackend()
    backend: Backend = fake

    first = backend.start(spec(1))
    second = backend.start(spec(2))

    assert first != second
    assert [s.instance_id for s in fake.started] == [1, 2]
    assert fake.handle_for(2) == second
    assert backend.alive(first)
    fake.set_alive(first, False)
    assert not backend.alive(first)
    assert not backend.alive("unknown")

    fake.stop_kills = False
    backend.stop(second)
    assert backend.alive(second)
    backend.stop(second, force=True)
    assert not backend.alive(second)
    assert fake.runners[second].stop_calls == [False, True]
    backend.stop("unknown")


def test_fake_backend_start_can_fail_once() -> None:
    fake = FakeBackend()
    fake.start_error = RuntimeError("no capacity")

    with pytest.raises(RuntimeError):
        fake.start(spec(1))
    assert fake.alive(fake.start(spec(1)))
