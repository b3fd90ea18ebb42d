"""Task YAML: SkyPilot's fields, and clear refusals."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpulease.core.errors import InvalidInput
from gpulease.core.taskspec import TaskSpec, matching_models, parse_task


def test_skypilot_task() -> None:
    spec = parse_task(
        """
name: digits
resources:
  accelerators: A100-80GB:1
  use_spot: false
envs:
  EPOCHS: 3
workdir: .
setup: pip list
run: python train.py --epochs $EPOCHS
"""
    )
    assert spec.name == "digits" and spec.accelerators == "A100-80GB:1"
    assert spec.envs == {"EPOCHS": "3"}
    script = spec.script()
    assert "exec bash -c 'pip list' setup)" in script
    assert script.endswith("exec bash -c 'python train.py --epochs $EPOCHS' run")


def test_accelerators_as_mapping() -> None:
    assert parse_task("resources: {accelerators: {T4: 2}}\nrun: x").accelerators == "T4:2"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("run: [unclosed", "not valid YAML"),
        ("- a list", "mapping"),
        ("name: x", "needs a 'run:'"),
        ("run: x\ncolour: blue", "unknown task field"),
        ("run: x\nsetpu: y", r"setpu \(did you mean setup\?\)"),
        ("run: x\nnum_nodes: 0", "num_nodes must be a whole number from 1"),
        ("run: x\nnum_nodes: two", "num_nodes must be a whole number from 1"),
        ("run: x\nresources: {accelerators: [1, 2]}", "accelerators"),
        ("run: x\nresources: {accelerators: 'A100:0.5'}", "whole GPUs"),
        ("run: x\nresources: {accelerators: 'A100:0'}", "count must be 1"),
        ("run: x\nresources: {accelerators: 'A100:two'}", "not a count"),
        ("run: x\nresources: {accelerators: {A100: [1]}}", "whole number"),
        ("run: x\nresources: {accelerators: ':1'}", "MODEL:COUNT"),
        ("run: x\nresources: {cpus: lots}", "number of vCPUs"),
        ("run: x\nresources: {memory: -4}", "number of GB"),
        ("run: x\nresources: {any_of: [{cloud: aws, accelerators: A100, disk: 1}]}", "disk"),
        ("run: x\nresources: {gpus: 2}", "unknown resources"),
        ("run: x\nresources: {acelerators: A100}", "did you mean accelerators"),
        ("run: x\nenvs: {'1BAD': x}", "environment variable"),
        ("run: x\nfile_mounts: {/data: s3://b}", "gpulease mounts datasets you pushed"),
        ("run: x\nfile_mounts: {/data/x: gpulease://y}", "mounted at /data/y, not /data/x"),
        ("run: x\nfile_mounts: {/data/X: gpulease://X}", "not a valid dataset name"),
        ("run: x\nfile_mounts: [a]", "must be a mapping"),
        ("run: 42", "must be a string"),
        ("run: x\nretry: true", "retry must be a whole number"),
        ("run: x\nretry: -1", "retry must be a whole number"),
        ("run: x\nretry: 11", "from 0 to 10"),
    ],
)
def test_bad_tasks(text: str, words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        parse_task(text)


def test_datasets_as_file_mounts() -> None:
    spec = parse_task(
        "run: ls /data\nfile_mounts:\n  /data/cats: gpulease://cats\n  /data/dogs: gpulease://dogs"
    )
    assert spec.datasets == ("cats", "dogs")
    assert parse_task("run: x").datasets == ()


def test_gpulease_fields_start_when_cheap_and_team() -> None:
    spec = parse_task("run: x\nstart_when_cheap: true\nteam: lab\nresources: {use_spot: true}")
    assert spec.start_when_cheap and spec.team == "lab" and spec.use_spot
    with pytest.raises(InvalidInput, match="true or false"):
        parse_task("run: x\nstart_when_cheap: sometimes")
    with pytest.raises(InvalidInput, match="team must be a string"):
        parse_task("run: x\nteam: [a, b]")
    assert parse_task("run: x\nretry: 2").retries == 2
    assert parse_task("run: x").retries == 0


@pytest.mark.parametrize(
    ("accelerators", "choices"),
    [
        ("A100:1", [("A100", 1)]),
        ("rtx4090", [("rtx4090", 1)]),
        ("{A100: 2}", [("A100", 2)]),
        ("{A100, V100}", [("A100", 1), ("V100", 1)]),
        ("!!set {A100, V100}", [("A100", 1), ("V100", 1)]),
        ("{A100: 1, V100: 1}", [("A100", 1), ("V100", 1)]),
        ("['A100:1', 'V100:2']", [("A100", 1), ("V100", 2)]),
        ("['H100:8', {A100: 8}]", [("H100", 8), ("A100", 8)]),
    ],
)
def test_accelerators_in_every_skypilot_form(
    accelerators: str, choices: list[tuple[str, int]]
) -> None:
    spec = parse_task(f"resources:\n  accelerators: {accelerators}\nrun: x")
    assert [(c.name, c.count) for c in spec.accelerator_choices] == choices
    assert spec.accelerators == (f"{choices[0][0]}:{choices[0][1]}" if len(choices) == 1 else None)


def test_any_of_and_ordered_give_choices() -> None:
    spec = parse_task(
        "resources:\n  any_of:\n    - {accelerators: A100:1, cloud: gcp}\n"
        "    - {accelerators: 'V100:1', region: us-east-1}\nrun: x"
    )
    assert [str(c) for c in spec.accelerator_choices] == ["A100:1", "V100:1"]
    assert spec.ignored == ("resources.any_of.cloud", "resources.any_of.region")
    listed = parse_task("resources: [{accelerators: T4}, {accelerators: L4}]\nrun: x")
    assert [str(c) for c in listed.accelerator_choices] == ["T4:1", "L4:1"]


def test_cloud_only_fields_are_ignored_with_one_warning() -> None:
    spec = parse_task(
        """
name: train
resources:
  infra: aws/us-east-1
  cloud: aws
  region: us-east-1
  zone: us-east-1a
  disk_size: 256
  disk_tier: best
  instance_type: p4d.24xlarge
  image_id: docker:nvcr.io/nvidia/pytorch:24.01-py3
  ports: 8080
  labels: {team: ml}
  accelerators: A100:8
service:
  readiness_probe: /
config:
  kubernetes: {}
experimental:
  config_overrides: {}
volumes:
  /mnt/data: my-volume
run: python train.py
"""
    )
    assert spec.accelerators == "A100:8"
    warning = spec.ignored_warning()
    assert warning is not None and "\n" not in warning and "ignored here" in warning
    for name in ("infra", "cloud", "region", "zone", "disk_size", "image_id", "ports"):
        assert f"resources.{name}" in warning
    for name in ("service", "config", "experimental", "volumes"):
        assert name in spec.ignored
    assert parse_task("run: x").ignored_warning() is None


@pytest.mark.parametrize(
    ("cpus", "memory", "expected"),
    [
        ("4+", "16+", ("4+", "16+")),
        ("8", "32", ("8", "32")),
        ("0.5", "16GB+", ("0.5", "16+")),
        ("2", "64GB", ("2", "64")),
    ],
)
def test_cpus_and_memory(cpus: str, memory: str, expected: tuple[str, str]) -> None:
    spec = parse_task(f"resources: {{cpus: '{cpus}', memory: '{memory}'}}\nrun: x")
    assert (str(spec.cpus), str(spec.memory_gb)) == expected
    assert spec.cpus is not None and spec.cpus.at_least == cpus.endswith("+")


def test_secrets_are_environment_variables() -> None:
    spec = parse_task("envs: {A: 1}\nsecrets: {HF_TOKEN: null, B: x}\nrun: x")
    assert spec.envs == {"A": "1", "HF_TOKEN": "", "B": "x"}


def test_a_bare_command_runs_as_typed() -> None:
    assert TaskSpec(run="python -c 'x = 1'").script() == "python -c 'x = 1'"


def test_family_names_resolve_to_catalog_models() -> None:
    models = ["T4", "V100", "RTX4090", "A100-40GB", "A100-80GB", "H100-80GB", "H200", "CPU"]
    assert matching_models("A100", models) == ["A100-40GB", "A100-80GB"]
    assert matching_models("a100-80gb", models) == ["A100-80GB"]
    assert matching_models("rtx4090", models) == ["RTX4090"]
    assert matching_models("RTX 4090", models) == ["RTX4090"]
    assert matching_models("h100", models) == ["H100-80GB"]
    assert matching_models("A10", models) == []
    assert matching_models("L4", models) == []


def run_script(spec: TaskSpec, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return subprocess.run(
        ["bash", "-c", spec.script()],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_setup_and_run_are_separate_scripts(tmp_path: Path) -> None:
    spec = parse_task(
        "resources: {accelerators: 'T4:2'}\n"
        "setup: |\n  echo setup sees ${CUDA_VISIBLE_DEVICES-unset}\n  exit 0\n  echo never\n"
        "run: |\n  echo run sees $CUDA_VISIBLE_DEVICES\n"
        "  echo rank=$SKYPILOT_NODE_RANK nodes=$SKYPILOT_NUM_NODES"
        " gpus=$SKYPILOT_NUM_GPUS_PER_NODE\n"
        '  echo task=$SKYPILOT_TASK_ID ips=$(echo "$SKYPILOT_NODE_IPS" | wc -l)\n'
        "  readlink ~/sky_workdir\n"
        "  exit 3\n"
    )
    result = run_script(spec, tmp_path, CUDA_VISIBLE_DEVICES="0,1", GPULEASE_RUN_ID="7")
    assert result.returncode == 3, result.stderr
    assert result.stdout.splitlines() == [
        "setup sees unset",
        "run sees 0,1",
        "rank=0 nodes=1 gpus=2",
        "task=gpulease-instance-0-run-7 ips=1",
        str(tmp_path),
    ]


def test_a_multi_node_rank_keeps_the_variables_the_server_gave_it(tmp_path: Path) -> None:
    spec = parse_task(
        "num_nodes: 2\nresources: {accelerators: 'T4:1'}\n"
        "run: |\n  echo $SKYPILOT_NODE_RANK/$SKYPILOT_NUM_NODES $SKYPILOT_TASK_ID\n"
        '  echo "$SKYPILOT_NODE_IPS" | tail -n 1\n'
    )
    assert spec.num_nodes == 2
    given = {
        "SKYPILOT_NODE_RANK": "1",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2",
        "SKYPILOT_TASK_ID": "gpulease-gang-4",
    }
    result = run_script(spec, tmp_path, **given)
    assert result.stdout.splitlines() == ["1/2 gpulease-gang-4", "10.0.0.2"], result.stderr


def test_a_failing_setup_fails_the_task_and_says_so(tmp_path: Path) -> None:
    spec = parse_task("setup: 'false; exit 5'\nrun: echo ran")
    result = run_script(spec, tmp_path)
    assert result.returncode == 5 and result.stdout == ""
    assert "setup failed with exit code 5" in result.stderr


def test_cpu_only_runs_have_no_cuda_visible_devices(tmp_path: Path) -> None:
    spec = parse_task("run: echo ${CUDA_VISIBLE_DEVICES-unset} $SKYPILOT_NUM_GPUS_PER_NODE")
    assert run_script(spec, tmp_path, CUDA_VISIBLE_DEVICES="").stdout == "unset 0\n"


@pytest.mark.parametrize(
    ("written", "minutes"),
    [("2h", 120), ("90m", 90), ("1h30m", 90), ("1.5 h", 90), ("2d", 2880), ("45min", 45)],
)
def test_max_duration_in_words(written: str, minutes: int) -> None:
    spec = parse_task(f"run: python train.py\nmax_duration: {written}\n")
    assert spec.max_duration_minutes == minutes
    assert parse_task("run: python train.py\n").max_duration_minutes is None


@pytest.mark.parametrize("written", ["120", "2 hours", "soon", "0m", "''"])
def test_max_duration_needs_a_length_with_units(written: str) -> None:
    with pytest.raises(InvalidInput, match="max_duration"):
        parse_task(f"run: python train.py\nmax_duration: {written}\n")
