"""Task YAML: SkyPilot's fields, and clear refusals."""

from __future__ import annotations

import pytest

from gpulease.core.errors import InvalidInput
from gpulease.core.taskspec import parse_task


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
    assert spec.script().startswith("set -e\npip list\nset +e\npython train.py")


def test_accelerators_as_mapping() -> None:
    assert parse_task("resources: {accelerators: {T4: 2}}\nrun: x").accelerators == "T4:2"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("run: [unclosed", "not valid YAML"),
        ("- a list", "mapping"),
        ("name: x", "needs a 'run:'"),
        ("run: x\ncolour: blue", "unknown field"),
        ("run: x\nnum_nodes: 2", "one node"),
        ("run: x\nresources: {accelerators: [1, 2]}", "accelerators"),
        ("run: x\nresources: {gpus: 2}", "unknown resources"),
        ("run: x\nenvs: {'1BAD': x}", "environment variable"),
        ("run: x\nfile_mounts: {/data: s3://b}", "gpulease mounts datasets you pushed"),
        ("run: x\nfile_mounts: {/data/x: gpulease://y}", "mounted at /data/y, not /data/x"),
        ("run: x\nfile_mounts: {/data/X: gpulease://X}", "not a valid dataset name"),
        ("run: x\nfile_mounts: [a]", "must be a mapping"),
        ("run: 42", "must be a string"),
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
