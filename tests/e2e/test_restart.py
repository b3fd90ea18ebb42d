"""A server crash in the middle of a run: the job goes on, and is billed exactly once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpulease.core.money import cost_for_seconds
from processes import Platform
from ray_support import ON_BOTH_BACKENDS

pytestmark = pytest.mark.e2e


@ON_BOTH_BACKENDS  # and on Ray, on SQLite only: ray_support says why
def test_sigkill_the_server_during_a_run(platform: Platform, tmp_path: Path) -> None:
    platform.cli(
        "register", "--server", platform.url, "--name", "ann", "--password", "password-123"
    )
    follower = platform.popen_cli(
        "run",
        "--gpu",
        "A100-80GB:1",
        "--template",
        "python",
        "--",
        "for i in $(seq 1 12); do echo tick $i; sleep 0.5; done",
        stderr_path=tmp_path / "cli.err",
    )
    assert follower.stdout is not None
    first = follower.stdout.readline()  # the job is running and streaming
    assert first.startswith("tick"), first
    platform.kill()
    time.sleep(2)  # the job keeps ticking while no server is there
    platform.start()
    with follower.stdout:
        out = follower.stdout.read()
    assert follower.wait(180) == 0, (tmp_path / "cli.err").read_text()
    ticks = [line for line in (first + out).splitlines() if line.startswith("tick")]
    assert ticks == [f"tick {i}" for i in range(1, 13)], ticks  # every line, once, in order

    (instance,) = platform.cli_json("instance", "ls", "--all")  # type: ignore[misc]
    platform.wait_status(str(instance["id"]), "released")
    usage: Any = platform.cli_json("usage")
    (segment,) = usage["segments"]
    assert segment["ended_at"] is not None
    assert segment["charged_micro"] == cost_for_seconds(
        segment["hourly_micro"], segment["billed_seconds"]
    )
    charged = -sum(line["amount_micro"] for line in usage["ledger"] if line["kind"] == "usage")
    assert charged == segment["charged_micro"]
    balance: Any = platform.cli_json("balance")
    assert balance["balance_micro"] == 10_000_000 - charged
    # the run took at least 6 s of GPU time, all of it billed despite the crash
    assert segment["billed_seconds"] >= 6


def test_a_runner_that_died_while_the_server_was_down_is_failed_at_start(
    platform: Platform,
) -> None:
    platform.cli(
        "register", "--server", platform.url, "--name", "ann", "--password", "password-123"
    )
    platform.cli(
        "instance", "create", "--gpu", "T4:1", "--template", "python", "--name", "doomed", "--wait"
    )
    platform.kill()
    platform.kill_runners("KILL")
    time.sleep(1)
    platform.start()
    deadline = time.monotonic() + 30
    got: Any = {}
    while time.monotonic() < deadline:
        got = platform.cli_json("instance", "show", "doomed")
        if got["status"] == "failed":
            break
        time.sleep(0.3)
    assert got["status"] == "failed", got
    assert "runner" in got["status_reason"]
    gpus = {g["name"]: g for g in platform.cli_json("gpus")}  # type: ignore[union-attr]
    assert gpus["T4"]["free"] == 1
