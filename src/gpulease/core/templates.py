"""Framework templates: named environment recipes that runners build into cached venvs."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from gpulease.core.errors import InvalidInput


@dataclass(frozen=True)
class Template:
    name: str
    description: str
    python: str
    packages: tuple[str, ...]
    # The CUDA version the framework build needs from the host driver; None for CPU-only
    # recipes. Driver compatibility checks read this (see the templates issue).
    cuda: str | None

    def recipe_key(self) -> str:
        """Content hash of what gets installed: the cache key of the built environment."""
        recipe = {"python": self.python, "packages": sorted(self.packages)}
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["packages"] = list(self.packages)
        return data

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Template:
        packages = data.get("packages") or []
        assert isinstance(packages, list)
        cuda = data.get("cuda")
        return cls(
            name=str(data["name"]),
            description=str(data.get("description", "")),
            python=str(data.get("python", "3.11")),
            packages=tuple(str(p) for p in packages),
            cuda=None if cuda is None else str(cuda),
        )


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
        description="PyTorch 2.13 with NumPy and Pillow (the CUDA 13.0 build on GPU hosts)",
        python="3.11",
        packages=("torch==2.13.0", "numpy>=1.26,<3", "pillow>=10,<13"),
        cuda="13.0",
    ),
)


def get_template(name: str) -> Template:
    for template in BUILTIN_TEMPLATES:
        if template.name == name:
            return template
    known = ", ".join(t.name for t in BUILTIN_TEMPLATES)
    raise InvalidInput(f"unknown template {name!r}; choose one of: {known}")
