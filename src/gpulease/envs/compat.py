"""Which NVIDIA driver runs which CUDA build: the table, and the check nodes and templates pass.

Source: NVIDIA, "CUDA Toolkit Release Notes", section "CUDA Driver", Table 3 "CUDA Toolkit
and Corresponding Driver Versions" (Linux x86_64 column, the GA release of each version)
and Table 2 "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version
Compatibility": https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html

Minor-version compatibility: NVIDIA guarantees that an application built with any CUDA
X.y runs on any driver of the X.x branch floor in Table 2 (12.x: 525.60.13, 13.x: 580),
with limits (PTX JIT compilation of newer PTX and a few new APIs need the Table 3 driver).
The templates here are pip wheels that carry their own CUDA runtime (PyTorch, JAX), which
is exactly the case minor-version compatibility is for, and PyTorch documents its cu12x
wheels as running on any 525+ driver. So a node *can run* a template when its driver
reaches the Table 2 floor of the template's CUDA major version; between that floor and
the Table 3 driver the template runs "through minor-version compatibility", which
`note()` says. A CUDA version this table does not know is refused rather than guessed.

Nodes without an NVIDIA driver (CPU-only hosts and hosts with only simulated GPUs, the
local demo) run every template: a CUDA build of PyTorch or JAX runs on the CPU there
(`torch.cuda.is_available()` is False), and `note()` says so. CPU-only instances never
touch the GPU, so the driver does not matter for them either.

This module is stdlib-only on purpose: `gpulease.doctor` imports it inside instances,
where only the template's venv and the copied SDK exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulease.core.templates import Template

# Table 3: the driver each CUDA toolkit release (GA) shipped with and fully supports.
FULL_SUPPORT_DRIVER: dict[str, str] = {
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}
# Table 2: the oldest driver of each CUDA major version (minor-version compatibility).
MINOR_COMPAT_DRIVER: dict[str, str] = {
    "11": "450.80.02",
    "12": "525.60.13",
    "13": "580",
}
SOURCE_URL = "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html"


@dataclass(frozen=True)
class DriverRequirement:
    cuda: str
    minimum: str  # the oldest driver that runs it (minor-version compatibility)
    full: str | None  # the driver with full support for exactly this version, if known


@dataclass(frozen=True)
class NodeFacts:
    """What the check needs to know of a node: its driver (None: no NVIDIA driver)."""

    name: str
    driver_version: str | None
    real_gpus: int = 0
    simulated_gpus: int = 0


def version_tuple(text: str) -> tuple[int, ...]:
    """'535.104.05' -> (535, 104, 5); unreadable parts end the tuple."""
    parts: list[int] = []
    for piece in text.strip().split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits or digits != piece:
            break
        parts.append(int(digits))
    return tuple(parts)


def requirement(cuda: str) -> DriverRequirement | None:
    """The drivers that run CUDA `cuda` ("12.6"); None for a version this table lacks."""
    version = version_tuple(cuda)
    if not version:
        return None
    major = str(version[0])
    minimum = MINOR_COMPAT_DRIVER.get(major)
    if minimum is None:
        return None
    key = f"{version[0]}.{version[1] if len(version) > 1 else 0}"
    return DriverRequirement(cuda=key, minimum=minimum, full=FULL_SUPPORT_DRIVER.get(key))


def driver_runs(driver: str, cuda: str) -> bool:
    """Whether an installed driver ("535.104.05") runs CUDA `cuda` builds."""
    needed = requirement(cuda)
    return needed is not None and version_tuple(driver) >= version_tuple(needed.minimum)


def newest_cuda(driver: str) -> str | None:
    """The newest CUDA version in the table whose full-support driver is `driver` or older."""
    have = version_tuple(driver)
    best: str | None = None
    for cuda, needed in FULL_SUPPORT_DRIVER.items():
        if have >= version_tuple(needed) and (
            best is None or version_tuple(cuda) > version_tuple(best)
        ):
            best = cuda
    return best


def check_cuda(label: str, cuda: str | None, node: NodeFacts, *, gpus: bool = True) -> str | None:
    """None when `node` can run a build of CUDA `cuda`, else the reason, for people."""
    if cuda is None or not gpus or node.driver_version is None:
        return None
    needed = requirement(cuda)
    if needed is None:
        return (
            f"{label} is built for CUDA {cuda}, which this platform's driver table does not "
            "know; ask the operator to update gpulease"
        )
    if version_tuple(node.driver_version) >= version_tuple(needed.minimum):
        return None
    return f"{label} needs driver {needed.minimum} or newer; this node has {node.driver_version}"


def check(template: Template, node: NodeFacts, *, gpus: bool = True) -> str | None:
    """None when `node` can run `template` (for an instance with GPUs unless gpus=False),
    else why not: "PyTorch 2.14 cu130 needs driver 580 or newer; this node has 535.104.05"."""
    return check_cuda(template.label, template.cuda, node, gpus=gpus)


def note(template: Template, node: NodeFacts, *, gpus: bool = True) -> str | None:
    """What a user should know when `node` runs `template` in a reduced way, or None."""
    if template.cuda is None or not gpus:
        return None
    if node.driver_version is None:
        where = "simulated GPUs only" if node.simulated_gpus else "no NVIDIA driver"
        return f"{template.label} runs on the CPU on this node ({where}): CUDA is unavailable"
    needed = requirement(template.cuda)
    if needed is None or check(template, node) is not None:
        return None
    if needed.full and version_tuple(node.driver_version) < version_tuple(needed.full):
        return (
            f"{template.label} runs through CUDA minor-version compatibility on driver "
            f"{node.driver_version} (full CUDA {needed.cuda} support from {needed.full})"
        )
    return None


def compatible_templates(templates: list[Template], driver: str | None) -> list[Template]:
    """The CUDA templates among `templates` that a node with `driver` runs on its GPUs."""
    if driver is None:
        return []
    facts = NodeFacts(name="", driver_version=driver, real_gpus=1)
    return [t for t in templates if t.cuda is not None and check(t, facts) is None]
