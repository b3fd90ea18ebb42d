"""Task files: SkyPilot's task YAML fields that make sense on one gpulease server."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpulease.core.datasets import check_dataset_name
from gpulease.core.errors import InvalidInput

KNOWN_FIELDS = {
    "name",
    "resources",
    "envs",
    "workdir",
    "setup",
    "run",
    "num_nodes",
    "file_mounts",
    "template",
    # gpulease's own: start only inside an off-peak window; charge a team's wallet
    "start_when_cheap",
    "team",
}
KNOWN_RESOURCES = {"accelerators", "use_spot", "cloud", "region"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class TaskSpec:
    name: str | None = None
    accelerators: str | None = None
    use_spot: bool = False
    envs: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    setup: str | None = None
    run: str | None = None
    template: str = "pytorch"
    # Datasets from `file_mounts: {/data/NAME: gpulease://NAME}`, mounted read-only.
    datasets: tuple[str, ...] = ()
    start_when_cheap: bool = False
    team: str | None = None

    def script(self) -> str:
        """The shell script a run executes: setup (stop at the first error), then run."""
        parts = []
        if self.setup:
            parts.append(f"set -e\n{self.setup.rstrip()}\nset +e")
        if self.run:
            parts.append(self.run.rstrip())
        return "\n".join(parts)


def _accelerators(raw: Any) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw
    if isinstance(raw, dict) and len(raw) == 1:
        ((model, count),) = raw.items()
        return f"{model}:{count}"
    raise InvalidInput(
        "resources.accelerators must be a string like 'A100-80GB:4' or a mapping {A100-80GB: 4}"
    )


DATASET_SCHEME = "gpulease://"


def _dataset_mounts(raw: Any) -> tuple[str, ...]:
    """file_mounts: only `/data/NAME: gpulease://NAME` (a pushed dataset, read-only)."""
    if not raw:
        return ()
    if not isinstance(raw, dict):
        raise InvalidInput(
            "file_mounts must be a mapping like {/data/cat_images: gpulease://cat_images}"
        )
    names = []
    for target, source in raw.items():
        if not isinstance(source, str) or not source.startswith(DATASET_SCHEME):
            raise InvalidInput(
                f"file_mounts: {target}: {source!r} cannot be mounted; gpulease mounts datasets "
                "you pushed (`gpulease dataset push DIR --name NAME`) as "
                "'/data/NAME: gpulease://NAME'; copy other files with workdir"
            )
        name = source[len(DATASET_SCHEME) :]
        check_dataset_name(name)
        if target != f"/data/{name}":
            raise InvalidInput(
                f"file_mounts: dataset {name} is mounted at /data/{name}, not {target}; "
                f"write '/data/{name}: {source}'"
            )
        names.append(name)
    return tuple(names)


def parse_task(text: str) -> TaskSpec:
    """Parse task YAML; every refusal names the field and how to write it."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"the task file is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidInput("the task file must be a YAML mapping with at least a 'run:' field")
    unknown = set(data) - KNOWN_FIELDS
    if unknown:
        raise InvalidInput(
            f"unknown field(s) in the task file: {', '.join(sorted(map(str, unknown)))}; "
            f"known fields are {', '.join(sorted(KNOWN_FIELDS))}"
        )
    if data.get("num_nodes", 1) != 1:
        raise InvalidInput("num_nodes: gpulease runs a task on one node; set num_nodes: 1")
    datasets = _dataset_mounts(data.get("file_mounts"))
    resources = data.get("resources") or {}
    if not isinstance(resources, dict):
        raise InvalidInput("resources must be a mapping, for example {accelerators: 'T4:1'}")
    unknown_res = set(resources) - KNOWN_RESOURCES
    if unknown_res:
        raise InvalidInput(
            f"unknown resources field(s): {', '.join(sorted(map(str, unknown_res)))}"
        )
    envs = data.get("envs") or {}
    if not isinstance(envs, dict):
        raise InvalidInput("envs must be a mapping of NAME: value")
    for key in envs:
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise InvalidInput(f"envs: {key!r} is not a valid environment variable name")
    for key in ("name", "workdir", "setup", "run", "template", "team"):
        if key in data and data[key] is not None and not isinstance(data[key], str):
            raise InvalidInput(f"{key} must be a string")
    if not data.get("run"):
        raise InvalidInput("the task file needs a 'run:' command")
    if not isinstance(data.get("start_when_cheap", False), bool):
        raise InvalidInput("start_when_cheap must be true or false")
    return TaskSpec(
        name=data.get("name"),
        accelerators=_accelerators(resources.get("accelerators")),
        use_spot=bool(resources.get("use_spot", False)),
        envs={k: "" if v is None else str(v) for k, v in envs.items()},
        workdir=data.get("workdir"),
        setup=data.get("setup"),
        run=data.get("run"),
        template=data.get("template") or "pytorch",
        datasets=datasets,
        start_when_cheap=bool(data.get("start_when_cheap", False)),
        team=data.get("team"),
    )
