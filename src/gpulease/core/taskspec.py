"""Task files: SkyPilot's task YAML, as it is written for SkyPilot, run on one gpulease server.

docs/skypilot.md lists every SkyPilot field and what gpulease does with it: most are used,
the cloud-only ones (where to rent, which disk, which image) are accepted and ignored with
one warning, and anything that is not a SkyPilot field is refused.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from gpulease.core.catalog import CPU_MODEL, MAX_GPU_COUNT, parse_accelerators
from gpulease.core.datasets import check_dataset_name
from gpulease.core.durations import parse_minutes
from gpulease.core.errors import InvalidInput

KNOWN_FIELDS = {
    "name",
    "resources",
    "envs",
    "secrets",
    "workdir",
    "setup",
    "run",
    "num_nodes",
    "file_mounts",
    "template",
    # gpulease's own: start only inside an off-peak window; charge a team's wallet; run
    # again on a new instance when its instance fails (its node leaves the cluster, say)
    "start_when_cheap",
    "team",
    "retry",
    # gpulease's own: how long the task may hold its GPUs ("2h"): the instance stops then,
    # and the scheduler counts on it for backfill and for others' estimated starts
    "max_duration",
}
MAX_RETRIES = 10
# SkyPilot's top-level fields that only mean something on a cloud or a cluster manager.
IGNORED_FIELDS = {
    "config",
    "event_callback",
    "experimental",
    "service",
    "storage_mounts",
    "volumes",
}
KNOWN_RESOURCES = {"accelerators", "use_spot", "cpus", "memory", "any_of", "ordered"}
# SkyPilot's resources fields that choose a cloud, a machine or a disk: one server has none.
IGNORED_RESOURCES = {
    "accelerator_args",
    "autostop",
    "cloud",
    "disk_size",
    "disk_tier",
    "image_id",
    "infra",
    "instance_type",
    "job_recovery",
    "labels",
    "network_tier",
    "ports",
    "priority",
    "region",
    "spot_recovery",
    "zone",
}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(\+?)\s*$")


@dataclass(frozen=True)
class AcceleratorChoice:
    """One acceptable set of GPUs: `name` as the task wrote it (a catalog model such as
    A100-80GB, or a family such as A100 that the CLI resolves against the catalog)."""

    name: str
    count: int

    def __str__(self) -> str:
        return f"{self.name}:{self.count}"


@dataclass(frozen=True)
class Amount:
    """`cpus: 4+` or `memory: 16` (GB): SkyPilot's "at least" (`+`) or "exactly". A share
    on gpulease comes with the GPUs, so both are read as a minimum the share must meet."""

    value: float
    at_least: bool = False

    def __str__(self) -> str:
        return f"{self.value:g}{'+' if self.at_least else ''}"


@dataclass(frozen=True)
class TaskSpec:
    name: str | None = None
    # The GPUs when there is exactly one choice ("A100-80GB:1", "A100:1"); None with
    # several (accelerator_choices holds them) or none (CPU only).
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
    # Times to run the task again on a new instance after its instance failed under it.
    retries: int = 0
    max_duration_minutes: int | None = None
    # Every acceptable GPU set, in the order written (any of them will do).
    accelerator_choices: tuple[AcceleratorChoice, ...] = ()
    cpus: Amount | None = None
    memory_gb: Amount | None = None
    # Nodes that run the task together (a gang); each rank gets MASTER_ADDR, NODE_RANK, ...
    num_nodes: int = 1
    # SkyPilot fields the file set that mean nothing here ("resources.region", ...).
    ignored: tuple[str, ...] = ()
    # Read from a task file: the run behaves as SkyPilot's (setup and run apart, SKYPILOT_*
    # variables, ~/sky_workdir). A bare command runs as it was typed.
    skypilot: bool = False

    def script(self) -> str:
        """The shell script a run executes. A bare command is itself. A task file's setup
        and run are separate bash scripts as in SkyPilot: setup first, without
        CUDA_VISIBLE_DEVICES (an `exit 0` in it ends setup only); when it fails, the run
        ends with its exit code and says so; then run, with SkyPilot's variables."""
        if not self.skypilot:
            if self.setup:
                return f"set -e\n{self.setup.rstrip()}\nset +e\n{(self.run or '').rstrip()}"
            return (self.run or "").rstrip()
        parts = [self._skypilot_prelude()]
        if self.setup:
            parts.append(
                f"(unset CUDA_VISIBLE_DEVICES; exec bash -c {shlex.quote(self.setup)} setup)\n"
                "code=$?\n"
                'if [ "$code" -ne 0 ]; then\n'
                '  echo "gpulease: setup failed with exit code $code; run was not started" >&2\n'
                '  exit "$code"\n'
                "fi"
            )
        parts.append(f"exec bash -c {shlex.quote(self.run or '')} run")
        return "\n".join(parts)

    def _skypilot_prelude(self) -> str:
        _, gpus = parse_accelerators(self.accelerators)
        return "\n".join(
            [
                # No GPU: no CUDA_VISIBLE_DEVICES at all, as on SkyPilot's CPU nodes.
                '[ -n "${CUDA_VISIBLE_DEVICES:-}" ] || unset CUDA_VISIBLE_DEVICES',
                # A multi-node run's ranks have them from the server; one node: these.
                'export SKYPILOT_NODE_RANK="${SKYPILOT_NODE_RANK:-0}"',
                'export SKYPILOT_NUM_NODES="${SKYPILOT_NUM_NODES:-1}"',
                f'export SKYPILOT_NUM_GPUS_PER_NODE="${{SKYPILOT_NUM_GPUS_PER_NODE:-{gpus}}}"',
                'if [ -z "${SKYPILOT_NODE_IPS:-}" ]; then',
                '  SKYPILOT_NODE_IPS="$(hostname -I 2>/dev/null | cut -d" " -f1)"',
                "fi",
                'export SKYPILOT_NODE_IPS="${SKYPILOT_NODE_IPS:-127.0.0.1}"',
                'export SKYPILOT_TASK_ID="${SKYPILOT_TASK_ID:-gpulease-instance-'
                '${GPULEASE_INSTANCE_ID:-0}-run-${GPULEASE_RUN_ID:-0}}"',
                # SkyPilot puts the workdir at ~/sky_workdir; here it is the working directory.
                'if [ ! -e "$HOME/sky_workdir" ] || [ -L "$HOME/sky_workdir" ]; then',
                '  ln -sfn "$PWD" "$HOME/sky_workdir" 2>/dev/null || true',
                "fi",
            ]
        )

    def ignored_warning(self) -> str | None:
        """One line naming the cloud-only fields the file set, or None when there are none."""
        if not self.ignored:
            return None
        return (
            f"ignored here (they choose a cloud, machine or disk; gpulease runs on its own "
            f"nodes): {', '.join(self.ignored)}"
        )


def _count(raw: Any, name: str) -> int:
    if raw is None:
        return 1
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise InvalidInput(f"resources.accelerators: {name}: the count must be a whole number")
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInput(
            f"resources.accelerators: {name}: {raw!r} is not a count; write {name}:1"
        ) from None
    if not math.isfinite(value) or value != int(value):
        raise InvalidInput(
            f"resources.accelerators: {name}: {raw} GPUs: gpulease rents whole GPUs; write {name}:1"
        )
    count = int(value)
    if not 1 <= count <= MAX_GPU_COUNT:
        raise InvalidInput(
            f"resources.accelerators: {name}: the count must be 1..{MAX_GPU_COUNT}; "
            "for a CPU-only task leave accelerators out"
        )
    return count


def _choice_text(text: str) -> AcceleratorChoice:
    name, sep, count = text.strip().partition(":")
    if not name.strip():
        raise InvalidInput(
            f"resources.accelerators: {text!r}: write the GPU as MODEL:COUNT, e.g. A100:1"
        )
    return AcceleratorChoice(name.strip(), _count(count.strip() if sep else None, name.strip()))


_ACCELERATOR_FORMS = (
    "resources.accelerators must be 'A100:1', {A100: 1}, any of several as {A100, V100} or "
    "{A100: 1, V100: 1}, or a list of choices ['A100:1', 'V100:1']"
)


def _accelerator_choices(raw: Any) -> tuple[AcceleratorChoice, ...]:
    """Every SkyPilot form: 'A100:1', {A100: 1}, {A100, V100} (a YAML set: a mapping of
    nulls), {A100: 1, V100: 2}, ['A100:1', 'V100:1']."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        if raw.strip().lower() in {"", CPU_MODEL.lower(), "none"}:
            return ()
        return (_choice_text(raw),)
    if isinstance(raw, set | frozenset) and raw:  # !!set {A100, V100}
        raw = dict.fromkeys(sorted(map(str, raw)))
    if isinstance(raw, dict) and raw:
        choices = []
        for name, count in raw.items():
            if not isinstance(name, str) or not name.strip():
                raise InvalidInput(_ACCELERATOR_FORMS)
            choices.append(AcceleratorChoice(name.strip(), _count(count, name.strip())))
        return tuple(choices)
    if isinstance(raw, list) and raw:
        if not all(isinstance(item, str | dict) for item in raw):
            raise InvalidInput(_ACCELERATOR_FORMS)
        return tuple(choice for item in raw for choice in _accelerator_choices(item))
    raise InvalidInput(_ACCELERATOR_FORMS)


def _amount(raw: Any, key: str, unit: str) -> Amount | None:
    if raw is None:
        return None
    text = str(raw)
    if key == "memory" and text.lower().rstrip("+").endswith("gb"):
        text = text[: text.lower().rindex("gb")] + ("+" if text.endswith("+") else "")
    match = _AMOUNT.match(text) if not isinstance(raw, bool) else None
    if match is None or float(match[1]) <= 0:
        raise InvalidInput(
            f"resources.{key}: {raw!r}: write a number of {unit}, or at least that many with "
            f"a +, e.g. {key}: 4+"
        )
    return Amount(float(match[1]), at_least=bool(match[2]))


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


def _refuse_unknown(found: set[Any], known: set[str], where: str) -> None:
    """Not SkyPilot's nor gpulease's: refused, with the closest known name when there is one."""
    if not found:
        return
    hints = []
    for name in sorted(map(str, found)):
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hints.append(f"{name} (did you mean {close[0]}?)" if close else name)
    raise InvalidInput(
        f"unknown {where} field(s): {', '.join(hints)}; known fields are {', '.join(sorted(known))}"
    )


def _resources(data: dict[str, Any], ignored: list[str]) -> dict[str, Any]:
    resources = data.get("resources") or {}
    if isinstance(resources, list):  # SkyPilot's shorthand for any_of
        resources = {"any_of": resources}
    if not isinstance(resources, dict):
        raise InvalidInput("resources must be a mapping, for example {accelerators: 'T4:1'}")
    ignored += [f"resources.{k}" for k in sorted(set(resources) & IGNORED_RESOURCES)]
    _refuse_unknown(
        set(resources) - KNOWN_RESOURCES - IGNORED_RESOURCES,
        KNOWN_RESOURCES | IGNORED_RESOURCES,
        "resources",
    )
    return resources


def _alternatives(resources: dict[str, Any], ignored: list[str]) -> tuple[AcceleratorChoice, ...]:
    """accelerators, and those of any_of/ordered entries (each a resources mapping)."""
    choices = list(_accelerator_choices(resources.get("accelerators")))
    for key in ("any_of", "ordered"):
        entries = resources.get(key)
        if entries is None:
            continue
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise InvalidInput(f"resources.{key} must be a list of resources mappings")
        for entry in entries:
            for name in sorted(set(entry) & IGNORED_RESOURCES):
                if f"resources.{key}.{name}" not in ignored:
                    ignored.append(f"resources.{key}.{name}")
            _refuse_unknown(
                set(entry) - {"accelerators", "use_spot"} - IGNORED_RESOURCES,
                {"accelerators", "use_spot"} | IGNORED_RESOURCES,
                f"resources.{key}",
            )
            choices += _accelerator_choices(entry.get("accelerators"))
    return tuple(dict.fromkeys(choices))


def parse_task(text: str) -> TaskSpec:
    """Parse task YAML; every refusal names the field and how to write it."""
    import yaml  # here, not at import: commands that only read this module's limits skip it

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"the task file is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidInput("the task file must be a YAML mapping with at least a 'run:' field")
    ignored = sorted(str(k) for k in set(data) & IGNORED_FIELDS)
    _refuse_unknown(
        set(data) - KNOWN_FIELDS - IGNORED_FIELDS, KNOWN_FIELDS | IGNORED_FIELDS, "task"
    )
    num_nodes = data.get("num_nodes", 1)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or not 1 <= num_nodes <= 64:
        raise InvalidInput(
            "num_nodes must be a whole number from 1 to 64: how many nodes run the task "
            "together (num_nodes: 2)"
        )
    datasets = _dataset_mounts(data.get("file_mounts"))
    resources = _resources(data, ignored)
    choices = _alternatives(resources, ignored)
    envs: dict[str, Any] = {}
    for key in ("envs", "secrets"):  # SkyPilot's secrets are environment variables too
        values = data.get(key) or {}
        if not isinstance(values, dict):
            raise InvalidInput(f"{key} must be a mapping of NAME: value")
        for name in values:
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise InvalidInput(f"{key}: {name!r} is not a valid environment variable name")
        envs.update(values)
    for key in ("name", "workdir", "setup", "run", "template", "team"):
        if key in data and data[key] is not None and not isinstance(data[key], str):
            raise InvalidInput(f"{key} must be a string")
    if not data.get("run"):
        raise InvalidInput("the task file needs a 'run:' command")
    if not isinstance(data.get("start_when_cheap", False), bool):
        raise InvalidInput("start_when_cheap must be true or false")
    retries = data.get("retry", 0)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
        raise InvalidInput(
            f"retry must be a whole number from 0 to {MAX_RETRIES}: how many times to run the "
            "task again when its instance fails (retry: 1)"
        )
    raw_duration = data.get("max_duration")
    max_duration = None if raw_duration is None else parse_minutes(raw_duration, "max_duration")
    return TaskSpec(
        name=data.get("name"),
        accelerators=str(choices[0]) if len(choices) == 1 else None,
        accelerator_choices=choices,
        use_spot=bool(resources.get("use_spot", False)),
        cpus=_amount(resources.get("cpus"), "cpus", "vCPUs"),
        memory_gb=_amount(resources.get("memory"), "memory", "GB"),
        envs={k: "" if v is None else str(v) for k, v in envs.items()},
        workdir=data.get("workdir"),
        setup=data.get("setup"),
        run=data.get("run"),
        template=data.get("template") or "pytorch",
        datasets=datasets,
        start_when_cheap=bool(data.get("start_when_cheap", False)),
        team=data.get("team"),
        retries=retries,
        max_duration_minutes=max_duration,
        num_nodes=num_nodes,
        ignored=tuple(ignored),
        skypilot=True,
    )


def _folded(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def matching_models(name: str, models: list[str]) -> list[str]:
    """The catalog models a task's GPU name stands for, case and punctuation aside: a model
    itself ('a100-80gb', 'RTX 4090'), else a family: every model whose name before its first
    '-' is that name ('A100' is A100-40GB and A100-80GB, 'H100' is H100-80GB)."""
    wanted = _folded(name)
    exact = [m for m in models if _folded(m) == wanted]
    if exact:
        return exact
    return [m for m in models if _folded(m.split("-", 1)[0]) == wanted]
