"""Templates against the driver: the API refuses what no node can run, the scheduler places
only on nodes whose driver runs the template, and own templates round-trip through a runner.

The driver version comes through discovery's NVML seam (`build_runtime(..., nvml=...)` and
`discover(..., nvml=...)` feeding `register_node`), as on a real GPU host.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from factories import Caller, RunnerDouble, make_running_instance, make_settings
from gpulease.backends.fake import FakeBackend
from gpulease.gpus.discovery import discover
from gpulease.server.db import transaction
from gpulease.server.orm import Instance, Node
from gpulease.server.runtime import Runtime, build_runtime
from gpulease.server.services import nodes
from gpulease.server.settings import Settings

MIB = 1024 * 1024


class FakeNVMLError(Exception):
    pass


@dataclass
class FakeNvml:
    """NVML as a driver of the given version answers it, with A100-80GB GPUs."""

    driver: str
    cuda: int  # NVML's integer form: 12020 = 12.2
    uuids: list[str] = field(default_factory=list)

    NVMLError = FakeNVMLError

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return index

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self.uuids[handle]

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return SimpleNamespace(total=81920 * MIB, used=0, free=81920 * MIB)

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.cuda


OLD_DRIVER = "535.104.05"  # CUDA 12.2
NEW_DRIVER = "580.82.07"  # CUDA 13.0


@pytest.fixture
def settings(tmp_path: Any, database_url: str) -> Settings:
    return make_settings(tmp_path / "home", database_url, simulated_gpus="T4:1")


@pytest.fixture
def rt(settings: Settings, backend: FakeBackend) -> Iterator[Runtime]:
    """This host: two real A100-80GB on driver 535 (through the NVML seam), one simulated T4."""
    nvml = FakeNvml(OLD_DRIVER, 12020, ["GPU-old-0", "GPU-old-1"])
    runtime = build_runtime(settings, backend, nvml=nvml)
    yield runtime
    runtime.engine.dispose()


def add_node(rt: Runtime, name: str, nvml: FakeNvml) -> int:
    """Register another node from what its NVML reports, as its agent would."""
    with transaction(rt.sessions) as session:
        return nodes.register_node(session, name, "local", discover(rt.catalog, nvml=nvml)).id


def instance_row(rt: Runtime, instance_id: int) -> Instance:
    with transaction(rt.sessions) as session:
        row = session.get(Instance, instance_id)
        assert row is not None
        session.expunge(row)
        return row


def test_create_refuses_a_template_no_node_of_the_model_can_run(ann: Caller, rt: Runtime) -> None:
    with transaction(rt.sessions) as session:
        (node,) = session.query(Node).all()
        assert (node.driver_version, node.cuda_version) == (OLD_DRIVER, "12.2")

    r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1", "template": "pytorch-cu130"})

    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    assert "PyTorch 2.14 cu130 needs driver 580 or newer; this node has 535.104.05" in detail
    assert "pytorch-cu126" in detail and "update the driver" in detail


def test_a_compatible_template_starts_on_the_old_driver(
    ann: Caller, tick: Any, backend: FakeBackend, rt: Runtime
) -> None:
    r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1", "template": "pytorch-cu126"})
    assert r.status_code == 201, r.text
    tick()
    row = instance_row(rt, r.json()["id"])
    assert row.status in ("starting", "running")
    spec = backend.runners[backend.handle_for(row.id) or ""].spec
    assert spec.template.name == "pytorch-cu126" and spec.template.cuda == "12.6"


def test_cuda_templates_run_in_cpu_mode_on_simulated_gpus_and_cpu(ann: Caller, tick: Any) -> None:
    for gpu in ("T4:1", None):
        r = ann.post("/api/v1/instances", json={"gpu": gpu, "template": "pytorch-cu130"})
        assert r.status_code == 201, r.text


def test_the_scheduler_places_only_on_nodes_whose_driver_runs_the_template(
    ann: Caller, tick: Any, rt: Runtime
) -> None:
    new = add_node(rt, "gpu-new", FakeNvml(NEW_DRIVER, 13000, [f"GPU-new-{i}" for i in range(4)]))
    # The local node (2 free A100s) is the tighter fit for 1 GPU, but its driver is too old.
    r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1", "template": "pytorch-cu130"})
    assert r.status_code == 201, r.text
    tick()
    row = instance_row(rt, r.json()["id"])
    assert row.status in ("starting", "running") and row.node_id == new


def test_the_scheduler_refuses_when_the_driver_became_too_old(
    ann: Caller, tick: Any, rt: Runtime
) -> None:
    ids = [f"GPU-new-{i}" for i in range(4)]
    add_node(rt, "gpu-new", FakeNvml(NEW_DRIVER, 13000, ids))
    blocker = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:2", "template": "python"})
    assert blocker.status_code == 201  # takes the local node's two A100s, on the old driver
    tick()
    r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:4", "template": "pytorch-cu130"})
    assert r.status_code == 201, r.text
    # the new node is downgraded before the instance gets its GPUs
    add_node(rt, "gpu-new", FakeNvml(OLD_DRIVER, 12020, ids))
    tick()

    row = instance_row(rt, r.json()["id"])
    assert row.status == "stopped"
    assert row.status_reason == (
        "not started: PyTorch 2.14 cu130 needs driver 580 or newer; this node has 535.104.05"
    )


def test_templates_api_shows_availability_with_reasons(ann: Caller) -> None:
    found = {t["name"]: t for t in ann.get("/api/v1/templates").json()}

    assert {"python", "pytorch", "pytorch-cpu", "pytorch-cu130", "pytorch-cu126", "jax"} <= set(
        found
    )
    assert found["pytorch-cpu"]["extra_index_urls"] == ["https://download.pytorch.org/whl/cpu"]
    cu130 = {a["model"]: a for a in found["pytorch-cu130"]["availability"]}
    assert cu130["A100-80GB"]["available"] is False
    assert "needs driver 580 or newer" in cu130["A100-80GB"]["reason"]
    assert cu130["T4"]["available"] is True and "runs on the CPU" in cu130["T4"]["note"]
    cu126 = {a["model"]: a for a in found["pytorch-cu126"]["availability"]}
    assert cu126["A100-80GB"]["available"] is True
    assert (cu126["A100-80GB"]["free"], cu126["A100-80GB"]["total"]) == (2, 2)
    assert "minor-version compatibility" in cu126["A100-80GB"]["note"]

    one = {a["model"]: a for a in ann.get("/api/v1/templates/pytorch-cu130/availability").json()}
    assert one == cu130


def test_unknown_templates_are_refused_clearly(ann: Caller) -> None:
    r = ann.post("/api/v1/instances", json={"gpu": "T4:1", "template": "tensorflow"})
    assert r.status_code == 422 and "choose one of" in r.json()["detail"]
    r = ann.get("/api/v1/templates/nope/availability")
    assert r.status_code == 422
    r = ann.post("/api/v1/instances", json={"gpu": "T4:1", "template": "mine/nothing"})
    assert r.status_code == 404 and "you have no template 'mine/nothing'" in r.json()["detail"]


# -- own templates -------------------------------------------------------------------------------


def tasks_of(runner: RunnerDouble) -> list[dict[str, Any]]:
    r = runner.call("GET", "/commands", params={"wait": 0})
    assert r.status_code == 200, r.text
    return list(r.json()["tasks"])


FREEZE = [
    "torch==2.13.0+cpu",
    "numpy==2.4.6",
    "pillow==12.0.0",
    "-e git+https://example.invalid/repo.git@abc#egg=mylib",
    "einops==0.8.1",
]


def test_save_template_round_trip(
    ann: Caller, bob: Caller, tick: Any, runner_for: Any, backend: FakeBackend, rt: Runtime
) -> None:
    runner = make_running_instance(ann, tick, runner_for, "box", gpu="T4:1", template="pytorch")[1]

    saved = ann.post("/api/v1/instances/box/save-template", json={"name": "mytorch"})
    assert saved.status_code == 202, saved.text
    assert (saved.json()["name"], saved.json()["status"]) == ("mine/mytorch", "pending")
    (task,) = tasks_of(runner)
    assert task["kind"] == "snapshot_env"
    answered = runner.call("POST", f"/tasks/{task['id']}/result", json={"packages": FREEZE})
    assert answered.status_code == 204
    again = runner.call("POST", f"/tasks/{task['id']}/result", json={"packages": ["x==1"]})
    assert again.status_code == 204  # a retried answer changes nothing
    assert tasks_of(runner) == []

    mine = {t["name"]: t for t in ann.get("/api/v1/templates").json()}["mine/mytorch"]
    assert mine["own"] is True and mine["status"] == "ready"
    assert mine["packages"] == sorted(
        ["torch==2.13.0+cpu", "numpy==2.4.6", "pillow==12.0.0", "einops==0.8.1"]
    )
    assert mine["cuda"] == "13.0" and "-e git+" in mine["error"]  # the line left out, said why

    made = ann.post("/api/v1/instances", json={"gpu": None, "template": "mine/mytorch"})
    assert made.status_code == 201, made.text
    tick()
    spec = backend.runners[backend.handle_for(made.json()["id"]) or ""].spec
    assert spec.template.name == "mine/mytorch"
    assert "einops==0.8.1" in spec.template.packages

    # bob sees none of it, and cannot use it
    assert "mine/mytorch" not in [t["name"] for t in bob.get("/api/v1/templates").json()]
    refused = bob.post("/api/v1/instances", json={"gpu": "T4:1", "template": "mine/mytorch"})
    assert refused.status_code == 404
    assert bob.get("/api/v1/templates/mine/mytorch/availability").status_code == 404
    assert bob.post("/api/v1/instances/box/save-template", json={"name": "x"}).status_code == 404
    assert bob.delete("/api/v1/templates/mine/mytorch").status_code == 404

    # deleting: refused while an instance uses it, then gone
    in_use = ann.delete("/api/v1/templates/mine/mytorch")
    assert in_use.status_code == 409 and "release them first" in in_use.json()["detail"]
    assert ann.post(f"/api/v1/instances/{made.json()['id']}/release").status_code == 200
    assert ann.delete("/api/v1/templates/mine/mytorch").status_code == 204
    assert ann.delete("/api/v1/templates/mine/mytorch").status_code == 404


def test_save_template_refusals(ann: Caller, tick: Any, runner_for: Any) -> None:
    runner = make_running_instance(ann, tick, runner_for, "box", gpu="T4:1", template="pytorch")[1]
    other = make_running_instance(ann, tick, runner_for, "other", gpu=None, template="pytorch")[1]

    for bad in ("", "Big", "1abc", "a b", "x" * 49, "../etc"):
        r = ann.post("/api/v1/instances/box/save-template", json={"name": bad})
        assert r.status_code == 422, (bad, r.text)
    assert "valid template name" in r.json()["detail"]

    assert ann.post("/api/v1/instances/box/save-template", json={"name": "a"}).status_code == 202
    dup = ann.post("/api/v1/instances/box/save-template", json={"name": "a"})
    assert dup.status_code == 409 and "already have a template mine/a" in dup.json()["detail"]
    pending = ann.post("/api/v1/instances", json={"gpu": "T4:1", "template": "mine/a"})
    assert pending.status_code == 409 and "still being saved" in pending.json()["detail"]

    (task,) = tasks_of(runner)
    # another instance's runner cannot answer it
    assert (
        other.call("POST", f"/tasks/{task['id']}/result", json={"packages": []}).status_code == 404
    )
    failed = runner.call("POST", f"/tasks/{task['id']}/result", json={"error": "pip broke"})
    assert failed.status_code == 204
    listed = {t["name"]: t for t in ann.get("/api/v1/templates").json()}["mine/a"]
    assert (listed["status"], listed["error"]) == ("failed", "pip broke")
    # a failed name can be saved again
    assert ann.post("/api/v1/instances/box/save-template", json={"name": "a"}).status_code == 202

    ann.post("/api/v1/instances/other/stop")
    stopped = ann.post("/api/v1/instances/other/save-template", json={"name": "b"})
    assert stopped.status_code == 409 and "start it first" in stopped.json()["detail"]
