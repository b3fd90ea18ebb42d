"""A SkyPilot task file, unchanged, through a real server: cloud fields ignored with a
warning, a GPU family picked, setup and run as separate scripts, SkyPilot's variables."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from processes import Platform, running_platform

pytestmark = pytest.mark.e2e

TASK = """\
name: sky-check
workdir: code
resources:
  cloud: aws
  region: us-east-1
  disk_size: 256
  accelerators: {V100, t4}
envs:
  GREETING: hello
setup: |
  echo "setup: cuda=${CUDA_VISIBLE_DEVICES-unset}"
  echo made-in-setup > setup.out
  exit 0
  echo "setup: never"
run: |
  echo "run: $GREETING rank=$SKYPILOT_NODE_RANK nodes=$SKYPILOT_NUM_NODES"
  echo "run: gpus=$SKYPILOT_NUM_GPUS_PER_NODE task=${SKYPILOT_TASK_ID:+set}"
  echo "run: ips=$(printf '%s\\n' "$SKYPILOT_NODE_IPS" | wc -l)"
  echo "run: $(cat ~/sky_workdir/data.txt) $(cat ~/sky_workdir/setup.out)"
  exit 4
"""


@pytest.fixture
def platform(tmp_path: Path, database_url: str) -> Iterator[Platform]:
    if not database_url.startswith("sqlite"):
        pytest.skip("one whole run is enough; the database does not matter here")
    with running_platform(tmp_path, database_url, "A100-80GB:1,T4:1") as p:
        yield p


def test_a_skypilot_task_file_runs_unchanged(platform: Platform, tmp_path: Path) -> None:
    platform.cli(
        "register", "--server", platform.url, "--name", "ann", "--password", "password-123"
    )
    project = tmp_path / "project"
    (project / "code").mkdir(parents=True)
    (project / "code" / "data.txt").write_text("from-workdir\n")
    (project / "task.yaml").write_text(TASK + "template: python\n")
    result = platform.cli("run", str(project / "task.yaml"), check=False, timeout=300)
    assert result.returncode == 4, result.stderr
    assert result.stdout.splitlines() == [
        "setup: cuda=unset",
        "run: hello rank=0 nodes=1",
        "run: gpus=1 task=set",
        "run: ips=1",
        "run: from-workdir made-in-setup",
    ], result.stderr
    assert "ignored here" in result.stderr and "resources.disk_size" in result.stderr
    assert "accelerators V100:1, t4:1: T4:1" in result.stderr
