"""Framework templates: named environment recipes that runners build into cached venvs.

A recipe is a Python version, pinned packages, the pip options the pins need (an extra
index for builds that PyPI does not carry, such as PyTorch's `+cpu` and `+cu126` wheels)
and the CUDA version the framework build was compiled for (None: no CUDA at all). Which
nodes can run a recipe is decided in `gpulease.envs.compat` from that CUDA version.

What the names mean:

- `python`: Python only.
- `pytorch`: PyTorch 2.13 exactly as `pip install torch==2.13.0` resolves it, the template
  that examples, task files and `gpulease run` default to. PyPI's Linux wheel of it is the
  CUDA 13.0 build, so it is treated as a CUDA 13.0 template (driver 580 or newer on GPU
  nodes). Where the node's wheel mirror carries the CPU build (`2.13.0+cpu` sorts above
  `2.13.0`), pip installs that one. Its recipe is unchanged from earlier releases, so
  environments already built for it stay valid.
- `pytorch-cpu[-vision]`: the CPU build from PyTorch's CPU index; runs on every node.
- `pytorch-cu130[-vision]`: PyTorch 2.14 built for CUDA 13.0 (PyPI's default build).
- `pytorch-cu126[-vision]`: PyTorch 2.9 built for CUDA 12.6, for nodes on the 535-570
  driver branches.
- `jax`: JAX 0.10 (its CPU build, PyPI's default).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from gpulease.core.errors import InvalidInput

PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYTORCH_CU126_INDEX = "https://download.pytorch.org/whl/cu126"


@dataclass(frozen=True)
class Template:
    name: str
    description: str
    python: str
    packages: tuple[str, ...]
    # The CUDA version the framework build was compiled for ("13.0"); None for recipes
    # without CUDA. envs/compat.py turns it into the oldest driver that runs it.
    cuda: str | None
    # Extra package indexes pip searches besides its configured ones (`--extra-index-url`).
    extra_index_urls: tuple[str, ...] = ()
    # How people call the framework build, for messages: "PyTorch 2.14".
    framework: str = ""

    @property
    def label(self) -> str:
        """'PyTorch 2.14 cu130', 'JAX 0.10', 'Python 3.11': the build, as messages name it."""
        base = self.framework or f"Python {self.python}"
        if self.cuda is None:
            return base
        return f"{base} cu{self.cuda.replace('.', '')}"

    def recipe_key(self) -> str:
        """Content hash of what gets installed: the cache key of the built environment."""
        recipe: dict[str, object] = {"python": self.python, "packages": sorted(self.packages)}
        if self.extra_index_urls:  # absent for plain recipes, so their keys never change
            recipe["extra_index_urls"] = list(self.extra_index_urls)
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]

    def pip_options(self) -> list[str]:
        """The options `pip install` needs for this recipe, before the packages."""
        options: list[str] = []
        for url in self.extra_index_urls:
            options += ["--extra-index-url", url]
        return options

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["packages"] = list(self.packages)
        data["extra_index_urls"] = list(self.extra_index_urls)
        return data

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Template:
        packages = data.get("packages") or []
        indexes = data.get("extra_index_urls") or []
        assert isinstance(packages, list) and isinstance(indexes, list)
        cuda = data.get("cuda")
        return cls(
            name=str(data["name"]),
            description=str(data.get("description", "")),
            python=str(data.get("python", "3.11")),
            packages=tuple(str(p) for p in packages),
            cuda=None if cuda is None else str(cuda),
            extra_index_urls=tuple(str(u) for u in indexes),
            framework=str(data.get("framework", "")),
        )


_NUMPY = "numpy>=1.26,<3"
_PILLOW = "pillow>=10,<13"

BUILTIN_TEMPLATES: tuple[Template, ...] = (
    Template(
        name="python",
        description="Python 3.11 with pip, nothing else installed",
        python="3.11",
        packages=(),
        cuda=None,
    ),
    Template(
        name="pytorch",
        description=(
            "PyTorch 2.13 with NumPy and Pillow as pip resolves torch==2.13.0: PyPI's CUDA 13.0 "
            "build, or the CPU build where the node's wheel mirror has it; the default template"
        ),
        python="3.11",
        packages=("torch==2.13.0", _NUMPY, _PILLOW),
        cuda="13.0",
        framework="PyTorch 2.13",
    ),
    Template(
        name="pytorch-cpu",
        description="PyTorch 2.13 CPU build with NumPy and Pillow; runs on every node",
        python="3.11",
        packages=("torch==2.13.0+cpu", _NUMPY, _PILLOW),
        cuda=None,
        extra_index_urls=(PYTORCH_CPU_INDEX,),
        framework="PyTorch 2.13 CPU",
    ),
    Template(
        name="pytorch-cpu-vision",
        description="PyTorch 2.13 CPU build with torchvision 0.28, NumPy and Pillow",
        python="3.11",
        packages=("torch==2.13.0+cpu", "torchvision==0.28.0+cpu", _NUMPY, _PILLOW),
        cuda=None,
        extra_index_urls=(PYTORCH_CPU_INDEX,),
        framework="PyTorch 2.13 CPU",
    ),
    Template(
        name="pytorch-cu130",
        description="PyTorch 2.14 built for CUDA 13.0 (needs driver 580+), NumPy, Pillow",
        python="3.11",
        packages=("torch==2.14.1", _NUMPY, _PILLOW),
        cuda="13.0",
        framework="PyTorch 2.14",
    ),
    Template(
        name="pytorch-cu130-vision",
        description="PyTorch 2.14 for CUDA 13.0 with torchvision 0.29, NumPy, Pillow",
        python="3.11",
        packages=("torch==2.14.1", "torchvision==0.29.1", _NUMPY, _PILLOW),
        cuda="13.0",
        framework="PyTorch 2.14",
    ),
    Template(
        name="pytorch-cu126",
        description="PyTorch 2.9 built for CUDA 12.6 (drivers 525+), NumPy, Pillow",
        python="3.11",
        packages=("torch==2.9.1+cu126", _NUMPY, _PILLOW),
        cuda="12.6",
        extra_index_urls=(PYTORCH_CU126_INDEX,),
        framework="PyTorch 2.9",
    ),
    Template(
        name="pytorch-cu126-vision",
        description="PyTorch 2.9 for CUDA 12.6 with torchvision 0.24, NumPy, Pillow",
        python="3.11",
        packages=("torch==2.9.1+cu126", "torchvision==0.24.1+cu126", _NUMPY, _PILLOW),
        cuda="12.6",
        extra_index_urls=(PYTORCH_CU126_INDEX,),
        framework="PyTorch 2.9",
    ),
    Template(
        name="jax",
        description="JAX 0.10 (CPU build) with NumPy and SciPy",
        python="3.11",
        packages=("jax==0.10.2", "jaxlib==0.10.2"),
        cuda=None,
        framework="JAX 0.10",
    ),
)


def find_builtin(name: str) -> Template | None:
    for template in BUILTIN_TEMPLATES:
        if template.name == name:
            return template
    return None


def get_template(name: str) -> Template:
    template = find_builtin(name)
    if template is not None:
        return template
    known = ", ".join(t.name for t in BUILTIN_TEMPLATES)
    raise InvalidInput(
        f"unknown template {name!r}; choose one of: {known} (or one of yours as mine/NAME)"
    )
