"""The CPU and memory share the launcher gives each runner: per GPU from the pricing file,
else the node's cores and memory over its GPUs; CPU-only instances the pricing file's size."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from factories import Caller, RunnerDouble, make_settings
from gpulease.backends.base import RunnerSpec
from gpulease.backends.fake import FakeBackend
from gpulease.core.catalog import default_pricing_text
from gpulease.server.settings import Settings

GB = 2**30


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    pricing = tmp_path / "pricing.yaml"
    pricing.write_text(
        default_pricing_text().replace(
            '    hourly: "0.90"\n    nvml_match: ["A100"]\n  - name: A100-80GB',
            '    hourly: "0.90"\n    nvml_match: ["A100"]\n  - name: A100-80GB\n'
            "    vcpus: 0.5\n    ram_gb: 1.5",
        )
    )
    return make_settings(
        tmp_path / "home", database_url, simulated_gpus="A100-80GB:2,T4:2", pricing_file=pricing
    )


def launched(
    ann: Caller, tick: Callable[[], None], backend: FakeBackend, gpu: str | None
) -> RunnerSpec:
    created = ann.post("/api/v1/instances", json={"gpu": gpu} if gpu else {})
    assert created.status_code == 201, created.text
    tick()
    handle = backend.handle_for(created.json()["id"])
    assert handle is not None
    return backend.runners[handle].spec


def test_the_share_of_each_kind_of_instance(
    ann: Caller, tick: Callable[[], None], backend: FakeBackend
) -> None:
    priced = launched(ann, tick, backend, "A100-80GB:2")
    assert (priced.vcpus, priced.memory_bytes, priced.node_gpus) == (1.0, 3 * GB, 4)
    derived = launched(ann, tick, backend, "T4:1")
    cores = os.cpu_count() or 1
    assert derived.vcpus == pytest.approx(cores / 4)
    assert derived.memory_bytes is not None and derived.memory_bytes > 0
    cpu_only = launched(ann, tick, backend, None)
    assert cpu_only.vcpus == min(2.0, cores) and cpu_only.memory_bytes is not None
    assert cpu_only.memory_bytes <= 8 * GB


def test_a_resize_gives_the_next_start_the_new_share(
    ann: Caller,
    tick: Callable[[], None],
    backend: FakeBackend,
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    first = launched(ann, tick, backend, "A100-80GB:2")
    assert (first.vcpus, first.memory_bytes) == (1.0, 3 * GB)
    runner_for(first.instance_id).ready()
    ann.post(f"/api/v1/instances/{first.instance_id}/stop")
    runner_for(first.instance_id).stopped()
    tick()
    body = {"gpu_model": "A100-80GB", "gpu_count": 1}
    resized = ann.post(f"/api/v1/instances/{first.instance_id}/resize", json=body)
    assert resized.status_code == 200, resized.text
    assert ann.post(f"/api/v1/instances/{first.instance_id}/start").status_code == 200
    tick()
    handle = backend.handle_for(first.instance_id)
    assert handle is not None
    again = backend.runners[handle].spec
    assert (again.vcpus, again.memory_bytes) == (0.5, int(1.5 * GB))
