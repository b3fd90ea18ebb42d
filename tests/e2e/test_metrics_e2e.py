"""The three metrics paths (SDK, stdout key=value, TensorBoard) deliver the same points for one run.

Real server, CLI and runner. The job writes TensorBoard files with the real torch
SummaryWriter, which the `pytorch` template does not carry (no tensorboard): so this
server runs unsandboxed (single-user mode) and the job runs this test's own interpreter.
The sandboxed SDK path is tested with the real bwrap in tests/runner/test_metrics_runner.py.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from processes import ADMIN_PASSWORD, Platform, running_platform

pytestmark = pytest.mark.e2e
pytest.importorskip("torch.utils.tensorboard")

STEPS = 25
JOB = """
import math
from gpulease import track
from torch.utils.tensorboard import SummaryWriter

writer = SummaryWriter()  # default settings: ./runs/<date>_<host>/
for step in range(STEPS):
    loss = math.exp(-step / 7) + 0.01 * step
    acc = 1 - 0.9 ** (step + 1)
    track.log(step=step, loss=loss, acc=acc)
    print(f"step={step} loss={loss!r} acc={acc!r}", flush=True)
    writer.add_scalar("loss", loss, step)
    writer.add_scalar("acc", acc, step)
writer.close()
print("done")
"""


@pytest.fixture
def single_user(tmp_path: Path, database_url: str) -> Iterator[Platform]:
    if not database_url.startswith("sqlite"):
        # ~35 s a run: the points' storage is tested on both databases in process
        # (tests/server); this test is about the runner's three paths.
        pytest.skip("the metrics paths are tested whole-system on SQLite only")
    unsandboxed = {"GPULEASE_UNSANDBOXED_SINGLE_USER": "true"}
    with running_platform(tmp_path, database_url, "T4:1", unsandboxed) as p:
        yield p


def _points(platform: Platform, run_id: int) -> dict[str, dict[tuple[str, int], float]]:
    token = json.loads(platform.config.read_text())["token"]
    response = httpx.get(
        f"{platform.url}/api/v1/runs/{run_id}/metrics.csv",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    by_source: dict[str, dict[tuple[str, int], float]] = {}
    for row in csv.DictReader(io.StringIO(response.text)):
        by_source.setdefault(row["source"], {})[(row["key"], int(row["step"]))] = float(
            row["value"]
        )
    return by_source


def test_sdk_stdout_and_tensorboard_give_the_same_points(
    single_user: Platform, tmp_path: Path
) -> None:
    platform = single_user
    platform.cli("login", "--server", platform.url, "--name", "admin", "--password", ADMIN_PASSWORD)
    platform.cli("admin", "grant", "admin", "10.00")
    task = tmp_path / "task"
    task.mkdir()
    (task / "job.py").write_text(JOB.replace("STEPS", str(STEPS)))
    (task / "task.yaml").write_text(
        "name: metrics\n"
        "template: python\n"
        "resources:\n  accelerators: T4:1\n"
        "workdir: .\n"
        f"run: {sys.executable} job.py\n"
    )
    result = platform.cli("run", str(task / "task.yaml"))
    assert "done" in result.stdout, result.stdout

    (run,) = platform.cli_json("runs")  # type: ignore[misc]
    points = _points(platform, int(run["id"]))
    assert sorted(points) == ["sdk", "stdout", "tensorboard"]
    sdk, stdout, tensorboard = points["sdk"], points["stdout"], points["tensorboard"]
    expected_keys = {(key, step) for key in ("loss", "acc") for step in range(STEPS)}
    assert set(sdk) == set(stdout) == set(tensorboard) == expected_keys
    assert stdout == sdk  # repr() round-trips a double exactly
    for point, value in sdk.items():  # TensorBoard stores float32
        assert tensorboard[point] == pytest.approx(value, rel=1e-6, abs=1e-7)
