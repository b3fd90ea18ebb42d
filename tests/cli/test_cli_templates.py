"""CLI templates: where each runs and why not, `gpus --template`, saving an instance's env."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from wired_cli import Cli

from gpulease.gpus.discovery import discover
from gpulease.schemas.instances import InstanceCreate
from gpulease.server.db import transaction
from gpulease.server.services import nodes


class OldH100Nvml:
    """NVML of a node with two H100s on driver 535 (CUDA 12.2)."""

    NVMLError = RuntimeError

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return index

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return f"GPU-h100-{handle}"

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return SimpleNamespace(total=81559 * 1024 * 1024)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "535.104.05"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12020


REASON = "PyTorch 2.14 cu130 needs driver 580 or newer; this node has 535.104.05"


def add_old_h100_node(cli: Cli) -> None:
    rt = cli.server.rt
    with transaction(rt.sessions) as session:
        nodes.register_node(session, "h100-old", "local", discover(rt.catalog, nvml=OldH100Nvml()))


def test_templates_show_incompatible_models_with_the_reason(cli: Cli) -> None:
    add_old_h100_node(cli)
    cli.login_as("ann")

    listed = cli("templates")
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.stdout.splitlines() if "│ pytorch-cu130 " in line)
    assert "PyTorch 2.14 cu130" in row and "T4 (CPU mode)" in row
    assert "H100-80GB: PyTorch 2.14 cu130 needs" in row
    cu126 = next(line for line in listed.stdout.splitlines() if "│ pytorch-cu126 " in line)
    assert "H100-80GB (minor-version compat)" in listed.stdout and "│ -" in cu126
    as_json = {t["name"]: t for t in json.loads(cli("templates", "-o", "json").stdout)}
    h100 = {a["model"]: a for a in as_json["pytorch-cu130"]["availability"]}["H100-80GB"]
    assert (h100["available"], h100["reason"]) == (False, REASON)


def test_gpus_with_a_template_mark_models_unavailable(cli: Cli) -> None:
    add_old_h100_node(cli)
    cli.login_as("ann")

    shown = cli("gpus", "--template", "pytorch-cu130")
    assert shown.exit_code == 0, shown.output
    h100 = next(line for line in shown.stdout.splitlines() if "│ H100-80GB " in line)
    assert "no: PyTorch 2.14 cu130 needs driver 580" in h100
    t4 = next(line for line in shown.stdout.splitlines() if "│ T4 " in line)
    assert "yes (PyTorch 2.14 cu130 runs on the CPU" in t4
    data = json.loads(cli("gpus", "--template", "pytorch-cu126", "-o", "json").stdout)
    by_model = {m["name"]: m["template"] for m in data["models"]}
    assert by_model["H100-80GB"]["available"] is True

    unknown = cli("gpus", "--template", "mine/nothing")
    assert unknown.exit_code == 1 and "you have no template 'mine/nothing'" in unknown.stderr


def test_create_refuses_with_the_reason(cli: Cli) -> None:
    add_old_h100_node(cli)
    cli.login_as("ann")
    refused = cli("instance", "create", "--gpu", "H100-80GB:1", "--template", "pytorch-cu130")
    assert refused.exit_code == 1
    assert REASON in refused.stderr and "pytorch-cu126" in refused.stderr


def test_save_an_instance_environment_as_a_template(cli: Cli) -> None:
    ann = cli.login_as("ann")
    ann.instances.create(InstanceCreate(gpu="T4:1", template="pytorch", name="box"))
    cluster = cli.server.cluster
    for _ in range(3):
        cluster.step()
    assert ann.instances.get("box").status == "running"

    pending = cli("templates", "save", "box", "mine1", "--no-wait")
    assert pending.exit_code == 0, pending.output
    assert "saving mine/mine1: the runner has not answered yet" in pending.stdout
    bad = cli("templates", "save", "box", "Not Valid")
    assert bad.exit_code == 1 and "not a valid template name" in bad.stderr

    (runner,) = cli.server.backend.runners.values()
    headers = {"Authorization": f"Bearer {runner.spec.token}"}
    http = cli.server.http
    (task,) = http.get("/runner/v1/commands", params={"wait": 0}, headers=headers).json()["tasks"]
    answer = {"packages": ["torch==2.13.0+cpu", "numpy==2.4.6"]}
    assert http.post(f"/runner/v1/tasks/{task['id']}/result", json=answer, headers=headers)

    listed = cli("templates")
    print(listed.stdout)
    assert "mine/mine1" in listed.stdout
    mine = {t["name"]: t for t in json.loads(cli("templates", "-o", "json").stdout)}["mine/mine1"]
    assert mine["packages"] == ["numpy==2.4.6", "torch==2.13.0+cpu"]
    again = cli("templates", "save", "box", "mine1")
    assert again.exit_code == 1 and "already have a template mine/mine1" in again.stderr

    cli.login_as("bob")
    assert "mine/mine1" not in cli("templates").stdout
    assert cli("templates", "rm", "mine1").exit_code == 1  # bob has none

    cli.login_as("ann")
    removed = cli("templates", "rm", "mine/mine1")
    assert removed.exit_code == 0 and "deleted mine/mine1" in removed.stdout
    assert "mine/mine1" not in cli("templates").stdout
