"""End to end, as a renter does it: real server, CLI, runner and PyTorch training."""

from __future__ import annotations

import re
import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpulease.core.money import cost_for_seconds
from processes import REPO, Platform
from ray_support import ON_BOTH_BACKENDS

pytestmark = pytest.mark.e2e
# The GPU the digits task takes on each backend (the shared Ray cluster has no T4), its price
# in core/pricing.yaml (micro-credits an hour), the epochs it trains and whether it keeps its
# setup step (which imports torch once more): on Ray, where the run is about the backend and
# CI's time is short, two epochs (the loss halves within two) and no setup.
DIGITS_ON = {"local": ("T4", 250_000, 4, True), "ray": ("A100-80GB", 900_000, 2, False)}


def _register(platform: Platform, name: str = "ann") -> None:
    platform.cli("register", "--server", platform.url, "--name", name, "--password", "password-123")


def _digits_task(
    tmp_path: Path, data: Path, epochs: int = 4, gpu: str = "T4", setup: bool = True
) -> Path:
    """The example's task in tmp_path with data (the session's digits_data) copied in."""
    task = tmp_path / "digits"
    shutil.copytree(
        REPO / "examples" / "digits", task, ignore=shutil.ignore_patterns("data", "*.pt")
    )
    shutil.copytree(data, task / "data")
    text = (task / "task.yaml").read_text().replace("EPOCHS: 5", f"EPOCHS: {epochs}")
    text = text.replace("accelerators: T4:1", f"accelerators: {gpu}:1")
    if not setup:
        text = re.sub(r"^setup: \|\n(?:  .*\n)+", "", text, flags=re.MULTILINE)
    (task / "task.yaml").write_text(text)
    return task


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@ON_BOTH_BACKENDS  # and on Ray, on SQLite only: ray_support says why
def test_train_a_cnn_through_gpulease_run(
    platform: Platform, backend: str, tmp_path: Path, digits_data: Path
) -> None:
    gpu, hourly, epoch_count, setup = DIGITS_ON[backend]
    _register(platform)
    task = _digits_task(tmp_path, digits_data, epochs=epoch_count, gpu=gpu, setup=setup)
    before: Any = platform.cli_json("balance")
    started = time.monotonic()
    result = platform.cli("run", str(task / "task.yaml"))

    epochs = [
        (float(m["loss"]), float(m["elapsed"]))
        for m in re.finditer(
            r"epoch=\d+ loss=(?P<loss>[\d.]+) .* elapsed=(?P<elapsed>[\d.]+)", result.stdout
        )
    ]
    assert len(epochs) == epoch_count, result.stdout
    losses = [loss for loss, _ in epochs]
    assert losses[-1] < losses[0] * 0.5, f"the loss did not go down: {losses}"
    assert "train_images=1438" in result.stdout
    assert "saved=model.pt" in result.stdout

    # the one-shot instance is released (the CLI returns when the run ends; the stop and
    # release follow within seconds) and its GPU is free again
    (instance,) = platform.cli_json("instance", "ls", "--all")  # type: ignore[misc]
    platform.wait_status(str(instance["id"]), "released")
    wall = time.monotonic() - started
    gpus = {g["name"]: g for g in platform.cli_json("gpus")}  # type: ignore[union-attr]
    assert gpus[gpu]["free"] == gpus[gpu]["total"] > 0

    # billed for the seconds it held the GPU, to within one second's price
    usage: Any = platform.cli_json("usage")
    (segment,) = usage["segments"]
    held = (_time(segment["ended_at"]) - _time(segment["started_at"])).total_seconds()
    assert segment["billed_seconds"] == int(held)
    rate = segment["hourly_micro"]
    assert rate == hourly
    assert segment["charged_micro"] == cost_for_seconds(rate, segment["billed_seconds"])
    # within one second's price of the exact charge, and the floor to a whole micro-credit
    # on top (held 10.9967 s is billed as 10 s, and 10 s's price is floored)
    assert 0 <= rate * held / 3600 - segment["charged_micro"] < rate / 3600 + 1
    # independent bounds: it held the GPU at least while training, at most while the CLI ran
    assert epochs[-1][1] <= held <= wall
    after: Any = platform.cli_json("balance")
    assert before["balance_micro"] - after["balance_micro"] == segment["charged_micro"]
    charged = -sum(line["amount_micro"] for line in usage["ledger"] if line["kind"] == "usage")
    assert charged == segment["charged_micro"]


def test_failing_command_exit_code_reaches_the_cli(platform: Platform) -> None:
    _register(platform)
    result = platform.cli(
        "run",
        "--gpu",
        "A100-80GB:1",
        "--template",
        "python",
        "--",
        "echo gpus=$CUDA_VISIBLE_DEVICES; exit 7",
        check=False,
    )
    assert result.returncode == 7, result.stderr
    # simulated GPUs expose no real device to the job
    assert "gpus=\n" in result.stdout or result.stdout.strip().endswith("gpus=")


def test_exec_stop_start_keeps_the_workspace(platform: Platform) -> None:
    _register(platform)
    platform.cli(
        "instance", "create", "--gpu", "T4:1", "--template", "python", "--name", "box", "--wait"
    )
    platform.cli("exec", "box", "--", "echo kept > note.txt")
    platform.cli("instance", "stop", "box")
    platform.wait_status("box", "stopped")
    platform.cli("instance", "start", "box")
    platform.wait_status("box", "running")
    assert platform.cli("exec", "box", "--", "cat note.txt").stdout.strip() == "kept"
    platform.cli("instance", "release", "box")
    platform.wait_status("box", "released")
