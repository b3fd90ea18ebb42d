"""Resize changes the CPU and memory limits the instance's runner is launched with."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from factories import Caller, RunnerDouble, make_running_instance
from gpulease.backends.base import RunnerSpec
from gpulease.backends.fake import FakeBackend


def _spec(backend: FakeBackend, instance_id: int) -> RunnerSpec:
    handle = backend.handle_for(instance_id)
    assert handle is not None
    return backend.runners[handle].spec


def test_a_resized_instance_starts_with_the_new_models_share(
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    backend: FakeBackend,
) -> None:
    i, runner = make_running_instance(ann, tick, runner_for, "big", gpu="A100-80GB:2")
    before = _spec(backend, i)
    assert before.vcpus and before.memory_bytes
    ann.post(f"/api/v1/instances/{i}/stop")
    runner.stopped()
    r = ann.post(f"/api/v1/instances/{i}/resize", json={"gpu_model": "A100-80GB", "gpu_count": 1})
    assert r.status_code == 200, r.text
    assert ann.post(f"/api/v1/instances/{i}/start").status_code == 200
    tick()
    after = _spec(backend, i)
    assert after.token != before.token  # a new runner, launched after the resize
    # one GPU of the two: half the CPU and memory share
    assert after.vcpus == pytest.approx(before.vcpus / 2)
    assert after.memory_bytes == pytest.approx(before.memory_bytes / 2, rel=1e-3)
