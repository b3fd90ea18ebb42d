"""`gpulease doctor`: is this Python environment able to use its GPUs, and if not, the fix.

Stdlib only (plus `gpulease.envs.compat`, also stdlib only), so that it runs in any
template venv: inside an instance run `python -m gpulease.doctor` (the runner puts it on
every run's PYTHONPATH next to `gpulease.track`); on a machine with the gpulease CLI run
`gpulease doctor` (checks the active venv) or `gpulease doctor --python PATH`.

It reads the driver through NVML (libnvidia-ml, as nvidia-smi does; nvidia-smi itself when
NVML cannot be loaded), the CUDA version the driver supports, the framework builds (torch
and its `torch.version.cuda`, torchvision, jax), `torch.cuda.is_available()` and
CUDA_VISIBLE_DEVICES, and prints one line per check with a fix for each problem.
Exit status: 0 when nothing failed (warnings allowed), 1 otherwise.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpulease.envs.compat import driver_runs, newest_cuda, requirement

OK, INFO, WARN, FAIL = "ok", "info", "warn", "FAIL"
# The built-in template to suggest for drivers of each CUDA major version.
TEMPLATE_FOR_MAJOR = {13: "pytorch-cu130", 12: "pytorch-cu126"}
CPU_TEMPLATE = "pytorch-cpu"


@dataclass(frozen=True)
class Driver:
    version: str | None  # None: no NVIDIA driver found
    cuda: str | None  # the newest CUDA the driver supports, "12.2"
    gpus: int | None
    source: str  # "NVML", "nvidia-smi" or "" when not found
    error: str | None = None  # why no driver was found


@dataclass(frozen=True)
class Torch:
    version: str | None  # None: not installed
    cuda: str | None = None  # torch.version.cuda; None for the CPU build
    cuda_available: bool = False
    device_count: int = 0
    error: str | None = None  # import or CUDA init error


@dataclass(frozen=True)
class Facts:
    python: str
    executable: str
    driver: Driver
    visible_devices: str | None  # CUDA_VISIBLE_DEVICES; None when unset
    torch: Torch
    torchvision: str | None = None
    torchvision_error: str | None = None
    jax: str | None = None


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | info | warn | FAIL
    detail: str
    fix: str | None = None


@dataclass
class Report:
    facts: Facts
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(c.status == FAIL for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"facts": asdict(self.facts), "checks": [asdict(c) for c in self.checks]}


# -- reading the machine -----------------------------------------------------------------------


def _cuda_text(version: int) -> str:
    return f"{version // 1000}.{(version % 1000) // 10}"


def nvml_driver(load: Callable[[], Any]) -> Driver:
    """The driver through NVML's C API; `load` returns the library (ctypes.CDLL)."""
    try:
        lib = load()
    except OSError as exc:
        return Driver(None, None, None, "", f"NVML not found ({exc})")
    if lib.nvmlInit_v2() != 0:
        return Driver(None, None, None, "", "NVML did not initialise (no usable driver)")
    try:
        text = ctypes.create_string_buffer(96)
        got_driver = lib.nvmlSystemGetDriverVersion(text, 96) == 0
        driver = text.value.decode(errors="replace") if got_driver else None
        cuda_version = ctypes.c_int(0)
        got_cuda = lib.nvmlSystemGetCudaDriverVersion_v2(ctypes.pointer(cuda_version)) == 0
        count = ctypes.c_uint(0)
        got_count = lib.nvmlDeviceGetCount_v2(ctypes.pointer(count)) == 0
    finally:
        lib.nvmlShutdown()
    return Driver(
        driver or None,
        _cuda_text(cuda_version.value) if got_cuda and cuda_version.value else None,
        int(count.value) if got_count else None,
        "NVML",
    )


def smi_driver(run: Callable[..., Any] = subprocess.run) -> Driver:
    """The driver as `nvidia-smi` reports it (when NVML cannot be loaded directly)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Driver(None, None, None, "", "nvidia-smi not found")
    try:
        done = run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Driver(None, None, None, "", f"nvidia-smi failed: {exc}")
    lines = [line.strip() for line in str(done.stdout).splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        return Driver(None, None, None, "", f"nvidia-smi failed: {str(done.stderr).strip()}")
    return Driver(lines[0], None, len(lines), "nvidia-smi")


def read_driver() -> Driver:
    found = nvml_driver(lambda: ctypes.CDLL("libnvidia-ml.so.1"))
    if found.version is not None:
        return found
    fallback = smi_driver()
    if fallback.version is not None:
        return fallback
    return Driver(None, None, None, "", f"{found.error}; {fallback.error}")


def read_torch(import_module: Callable[[str], Any] = importlib.import_module) -> Torch:
    try:
        torch = import_module("torch")
    except ImportError:
        return Torch(None)
    except Exception as exc:  # a broken install raises all sorts
        return Torch("?", error=f"import torch failed: {type(exc).__name__}: {exc}")
    version = str(getattr(torch, "__version__", "?"))
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    try:
        available = bool(torch.cuda.is_available())
        count = int(torch.cuda.device_count()) if available else 0
    except Exception as exc:
        return Torch(version, cuda, False, 0, f"torch.cuda failed: {type(exc).__name__}: {exc}")
    return Torch(version, None if cuda is None else str(cuda), available, count)


def _version_of(name: str, import_module: Callable[[str], Any]) -> tuple[str | None, str | None]:
    try:
        module = import_module(name)
    except ImportError:
        return None, None
    except Exception as exc:
        return "?", f"import {name} failed: {type(exc).__name__}: {exc}"
    return str(getattr(module, "__version__", "?")), None


def gather(
    env: Mapping[str, str] | None = None,
    driver: Callable[[], Driver] = read_driver,
    import_module: Callable[[str], Any] = importlib.import_module,
) -> Facts:
    """What doctor looks at, read from this process and machine (the seams are for tests)."""
    environ = os.environ if env is None else env
    torchvision, torchvision_error = _version_of("torchvision", import_module)
    jax, _ = _version_of("jax", import_module)
    return Facts(
        python=".".join(str(part) for part in sys.version_info[:3]),
        executable=sys.executable,
        driver=driver(),
        visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        torch=read_torch(import_module),
        torchvision=torchvision,
        torchvision_error=torchvision_error,
        jax=jax,
    )


# -- judging -----------------------------------------------------------------------------------


def _suggest(driver: str | None) -> str:
    """The built-in template to pick for this driver (pytorch-cpu when none has CUDA)."""
    if driver is None:
        return CPU_TEMPLATE
    for major in sorted(TEMPLATE_FOR_MAJOR, reverse=True):
        if driver_runs(driver, f"{major}.0"):
            return TEMPLATE_FOR_MAJOR[major]
    return CPU_TEMPLATE


def _assigned(visible: str | None) -> list[str] | None:
    """The GPUs CUDA_VISIBLE_DEVICES names; None when unset (every GPU of the host)."""
    if visible is None:
        return None
    return [part for part in visible.split(",") if part.strip()]


def diagnose(facts: Facts) -> list[Check]:
    """One check per concern, each with a fix when something is wrong."""
    checks: list[Check] = []
    drv = facts.driver
    assigned = _assigned(facts.visible_devices)
    wants_gpu = assigned is None and drv.version is not None or bool(assigned)

    # driver
    if drv.version is None:
        if assigned:
            checks.append(
                Check(
                    "driver",
                    FAIL,
                    f"no NVIDIA driver visible ({drv.error}) although GPUs {','.join(assigned)} "
                    "are assigned",
                    "ask the operator: the node's driver or its /dev/nvidia* devices are missing",
                )
            )
        else:
            checks.append(Check("driver", INFO, f"no NVIDIA driver on this machine ({drv.error})"))
    else:
        supports = drv.cuda or newest_cuda(drv.version)
        gpus = "" if drv.gpus is None else f", {drv.gpus} GPU{'s' if drv.gpus != 1 else ''}"
        checks.append(
            Check(
                "driver",
                OK,
                f"{drv.version} ({drv.source}), supports CUDA up to {supports or '?'}{gpus}",
            )
        )

    # CUDA_VISIBLE_DEVICES
    if assigned is None:
        checks.append(
            Check("CUDA_VISIBLE_DEVICES", INFO, "not set: every GPU of this machine is visible")
        )
    elif not assigned:
        checks.append(
            Check(
                "CUDA_VISIBLE_DEVICES",
                INFO,
                "empty: no GPU assigned (a CPU-only instance)",
                None,
            )
        )
    else:
        checks.append(Check("CUDA_VISIBLE_DEVICES", OK, f"GPUs {','.join(assigned)}"))

    # torch
    torch = facts.torch
    if torch.version is None:
        checks.append(Check("torch", INFO, "not installed in this environment"))
    elif torch.error and torch.version == "?":
        checks.append(
            Check(
                "torch",
                FAIL,
                torch.error,
                "the environment is broken: start a new instance from the template, or "
                "`pip install --force-reinstall torch` in a venv of your own",
            )
        )
    else:
        checks.extend(_torch_checks(facts, wants_gpu))

    # torchvision
    if facts.torchvision_error:
        checks.append(
            Check(
                "torchvision",
                FAIL,
                facts.torchvision_error,
                "torchvision must match torch (torch 2.13 ↔ torchvision 0.28, 2.14 ↔ 0.29, "
                "same CUDA build): use a -vision template",
            )
        )
    elif facts.torchvision is not None:
        checks.append(_torchvision_check(facts))
    if facts.jax is not None:
        checks.append(Check("jax", OK, facts.jax))
    return checks


def _torch_checks(facts: Facts, wants_gpu: bool) -> list[Check]:
    torch = facts.torch
    drv = facts.driver
    build = f"CUDA {torch.cuda} build" if torch.cuda else "CPU build"
    checks = [Check("torch", OK, f"{torch.version} ({build})")]
    if torch.cuda and drv.version is not None and not driver_runs(drv.version, torch.cuda):
        needed = requirement(torch.cuda)
        minimum = needed.minimum if needed else "?"
        checks.append(
            Check(
                "torch CUDA vs driver",
                FAIL,
                f"torch {torch.version} needs driver ≥ {minimum}; this node has {drv.version}",
                f"pick the {_suggest(drv.version)} template or ask the operator to update the "
                "driver",
            )
        )
    if torch.cuda_available:
        checks.append(
            Check("torch.cuda.is_available()", OK, f"True, {torch.device_count} device(s)")
        )
        return checks
    detail = "False" + (f" ({torch.error})" if torch.error else "")
    if torch.cuda is None:
        fix = (
            f"this torch is the CPU build; for the GPU pick the {_suggest(drv.version)} template"
            if drv.version is not None
            else "this machine has no NVIDIA driver, so torch runs on the CPU; for CUDA start an "
            "instance with --gpu MODEL:N on a node with NVIDIA GPUs and a CUDA template "
            "(`gpulease templates` says which run where)"
        )
    elif drv.version is None:
        fix = (
            "no NVIDIA driver is visible, so torch runs on the CPU; for CUDA start an instance "
            "with --gpu MODEL:N on a node with real NVIDIA GPUs"
        )
    elif not driver_runs(drv.version, torch.cuda):
        fix = f"pick the {_suggest(drv.version)} template or ask the operator to update the driver"
    else:
        fix = (
            "the driver is recent enough; check that `nvidia-smi` lists your GPUs and that "
            "CUDA_VISIBLE_DEVICES names them; if it does, ask the operator"
        )
    status = FAIL if wants_gpu else WARN
    checks.append(Check("torch.cuda.is_available()", status, detail, fix))
    return checks


def _torchvision_check(facts: Facts) -> Check:
    version = facts.torchvision or "?"
    torch_local = (facts.torch.version or "").partition("+")[2]
    vision_local = version.partition("+")[2]
    if torch_local and vision_local and torch_local != vision_local:
        return Check(
            "torchvision",
            FAIL,
            f"{version} is the {vision_local} build but torch {facts.torch.version} is "
            f"{torch_local}",
            "use a -vision template, whose torch and torchvision builds match",
        )
    return Check("torchvision", OK, version)


# -- output ------------------------------------------------------------------------------------


def render(report: Report) -> str:
    facts = report.facts
    lines = [f"gpulease doctor: Python {facts.python} at {facts.executable}"]
    for check in report.checks:
        lines.append(f"  {check.status:<5} {check.name:<26} {check.detail}")
        if check.fix and check.status in (WARN, FAIL):
            lines.append(f"  {'':<5} {'':<26} fix: {check.fix}")
    failures = sum(c.status == FAIL for c in report.checks)
    warnings = sum(c.status == WARN for c in report.checks)
    if failures:
        lines.append(f"{failures} problem(s) found; each says its fix")
    else:
        lines.append("no problems found" + (f" ({warnings} warning(s))" if warnings else ""))
    return "\n".join(lines)


def run_checks() -> Report:
    facts = gather()
    return Report(facts, diagnose(facts))


def install(target: Path) -> Path:
    """Copy doctor and what it imports into target/gpulease (a directory for PYTHONPATH), so
    that any Python 3.11+ runs `python -m gpulease.doctor` there. An existing
    gpulease/__init__.py (the runner's SDK) is kept. Returns target."""
    here = Path(__file__).resolve().parent
    package = target / "gpulease"
    (package / "envs").mkdir(parents=True, exist_ok=True)
    init = package / "__init__.py"
    if not init.exists():
        init.write_text('"""gpulease doctor, copied (gpulease.doctor.install)."""\n')
    for relative in ("doctor.py", "envs/compat.py"):
        _copy(here / relative, package / relative)
    envs_init = package / "envs" / "__init__.py"
    if not envs_init.exists():
        envs_init.write_text('"""Template environments (only compat is copied here)."""\n')
    return target


def _copy(source: Path, target: Path) -> None:
    text = source.read_text(encoding="utf-8")
    if target.exists() and target.read_text(encoding="utf-8") == text:
        return
    temporary = target.with_suffix(".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.chmod(0o644)
    temporary.replace(target)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    report = run_checks()
    if "--json" in args:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render(report))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
