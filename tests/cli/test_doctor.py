"""`gpulease doctor`: each check against fakes of the driver and of torch, then real runs in
this venv (CPU torch) and in a bare venv that has no gpulease installed."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import venv
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from gpulease import doctor
from gpulease.cli.main import app
from gpulease.doctor import FAIL, OK, WARN, Check, Driver, Facts, Torch, diagnose, nvml_driver

NO_DRIVER = Driver(None, None, None, "", "NVML not found")
OLD = Driver("535.104.05", "12.2", 2, "NVML")
NEW = Driver("580.82.07", "13.0", 2, "NVML")


def facts(
    driver: Driver,
    torch: Torch,
    visible: str | None = "0,1",
    torchvision: str | None = None,
) -> Facts:
    return Facts("3.11.7", "/venv/bin/python", driver, visible, torch, torchvision)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_a_cuda_13_torch_on_a_535_driver_fails_with_the_fix() -> None:
    torch = Torch("2.14.1+cu130", "13.0", cuda_available=False)
    checks = by_name(diagnose(facts(OLD, torch)))

    mismatch = checks["torch CUDA vs driver"]
    assert mismatch.status == FAIL
    assert mismatch.detail == "torch 2.14.1+cu130 needs driver ≥ 580; this node has 535.104.05"
    assert mismatch.fix == (
        "pick the pytorch-cu126 template or ask the operator to update the driver"
    )
    assert checks["torch.cuda.is_available()"].status == FAIL
    assert checks["driver"].detail == "535.104.05 (NVML), supports CUDA up to 12.2, 2 GPUs"


def test_a_matching_build_passes() -> None:
    torch = Torch("2.14.1+cu130", "13.0", cuda_available=True, device_count=2)
    checks = diagnose(facts(NEW, torch, torchvision="0.29.1+cu130"))
    assert all(c.status in (OK, "info") for c in checks), checks
    assert by_name(checks)["torch.cuda.is_available()"].detail == "True, 2 device(s)"


def test_the_cpu_build_on_a_gpu_instance_fails_with_the_template_to_pick() -> None:
    checks = by_name(diagnose(facts(NEW, Torch("2.13.0+cpu", None))))
    cuda = checks["torch.cuda.is_available()"]
    assert cuda.status == FAIL and "pick the pytorch-cu130 template" in (cuda.fix or "")


def test_a_cpu_instance_only_warns() -> None:
    checks = by_name(diagnose(facts(NO_DRIVER, Torch("2.13.0+cpu", None), visible="")))
    assert checks["CUDA_VISIBLE_DEVICES"].detail.startswith("empty: no GPU assigned")
    assert checks["torch.cuda.is_available()"].status == WARN
    assert not any(c.status == FAIL for c in checks.values())


def test_gpus_assigned_but_no_driver_visible() -> None:
    checks = by_name(diagnose(facts(NO_DRIVER, Torch("2.14.1+cu130", "13.0"), visible="0")))
    assert checks["driver"].status == FAIL and "ask the operator" in (checks["driver"].fix or "")


def test_mismatched_torchvision_and_broken_imports() -> None:
    checks = by_name(
        diagnose(facts(NEW, Torch("2.14.1+cu130", "13.0", True, 1), torchvision="0.29.1+cpu"))
    )
    assert checks["torchvision"].status == FAIL
    broken = by_name(diagnose(facts(NEW, Torch("?", error="import torch failed: OSError"))))
    assert broken["torch"].status == FAIL and "new instance" in (broken["torch"].fix or "")


class FakeNvmlLib:
    """libnvidia-ml's C functions as ctypes calls them: 0 = NVML_SUCCESS."""

    def __init__(self, init: int = 0) -> None:
        self.init = init
        self.shut = False

    def nvmlInit_v2(self) -> int:
        return self.init

    def nvmlSystemGetDriverVersion(self, buffer: Any, size: int) -> int:
        buffer.value = b"535.104.05"
        return 0

    def nvmlSystemGetCudaDriverVersion_v2(self, out: Any) -> int:
        out.contents.value = 12020
        return 0

    def nvmlDeviceGetCount_v2(self, out: Any) -> int:
        out.contents.value = 4
        return 0

    def nvmlShutdown(self) -> int:
        self.shut = True
        return 0


def test_the_driver_through_nvml() -> None:
    lib = FakeNvmlLib()
    assert nvml_driver(lambda: lib) == Driver("535.104.05", "12.2", 4, "NVML")
    assert lib.shut
    assert nvml_driver(lambda: FakeNvmlLib(init=9)).version is None

    def missing() -> Any:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    assert "NVML not found" in (nvml_driver(missing).error or "")
    assert isinstance(ctypes.c_int(0), ctypes.c_int)


def test_the_driver_through_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    answer = SimpleNamespace(returncode=0, stdout="580.82.07\n580.82.07\n", stderr="")
    found = doctor.smi_driver(lambda *a, **kw: answer)
    assert (found.version, found.gpus, found.source) == ("580.82.07", 2, "nvidia-smi")


def test_gather_reads_torch_through_the_import_seam() -> None:
    fake_torch = SimpleNamespace(
        __version__="2.14.1+cu130",
        version=SimpleNamespace(cuda="13.0"),
        cuda=SimpleNamespace(is_available=lambda: True, device_count=lambda: 2),
    )

    def importer(name: str) -> Any:
        if name == "torch":
            return fake_torch
        raise ImportError(name)

    seen = doctor.gather(
        {"CUDA_VISIBLE_DEVICES": "0,1"}, driver=lambda: NEW, import_module=importer
    )
    assert seen.torch == Torch("2.14.1+cu130", "13.0", True, 2)
    assert seen.visible_devices == "0,1" and seen.torchvision is None


def test_real_run_in_this_venv_reports_cuda_unavailable_with_a_fix() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpulease.doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["facts"]["torch"]["version"].startswith("2.")
    cuda = checks["torch.cuda.is_available()"]
    assert cuda["detail"].startswith("False") and cuda["status"] == WARN
    assert "CUDA" in cuda["fix"]


def test_cli_runs_doctor_in_a_venv_without_gpulease(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)

    result = CliRunner().invoke(app, ["doctor", "--python", str(bare / "bin" / "python")])

    assert result.exit_code == 0, result.output
    assert f"at {bare}/bin/python" in result.output
    assert "torch                      not installed in this environment" in result.output


def test_install_keeps_the_runner_sdk_package_init(tmp_path: Path) -> None:
    init = tmp_path / "gpulease" / "__init__.py"
    init.parent.mkdir()
    init.write_text("# the runner's SDK\n")

    doctor.install(tmp_path)
    doctor.install(tmp_path)  # idempotent

    assert init.read_text() == "# the runner's SDK\n"
    assert (tmp_path / "gpulease" / "doctor.py").read_text() == Path(doctor.__file__).read_text()
    assert (tmp_path / "gpulease" / "envs" / "compat.py").exists()
