"""CLI: instance autostop, schedule add/ls/rm, resize, start --no-gpu."""

from __future__ import annotations

import json

from wired_cli import Cli


def test_autostop_schedule_resize_and_no_gpu_start(cli: Cli) -> None:
    cli.login_as("ann")
    made = cli("instance", "create", "--gpu", "T4:1", "--name", "box", "--max-runtime", "60")
    assert made.exit_code == 0, made.output
    assert "60 min" in cli("instance", "autostop", "box", "--show").stdout

    shown = cli(
        "instance",
        "autostop",
        "box",
        "--idle-util",
        "5",
        "--idle-minutes",
        "30",
        "--max-runtime",
        "480",
    )
    assert shown.exit_code == 0, shown.output
    assert "under 5% GPU for 30 min" in shown.stdout and "480 min" in shown.stdout
    refused = cli("instance", "autostop", "box", "--idle-minutes", "1")
    assert refused.exit_code == 1 and "between 5 and" in refused.stderr

    assert cli("instance", "schedule", "timezone", "Europe/Berlin").exit_code == 0
    added = cli(
        "instance", "schedule", "add", "box", "--start", "0 9 * * 1-5", "--stop", "0 19 * * 1-5"
    )
    assert added.exit_code == 0, added.output
    assert "start at '0 9 * * 1-5' (Europe/Berlin)" in added.stdout
    listed = json.loads(cli("instance", "schedule", "ls", "box", "-o", "json").stdout)
    assert [s["action"] for s in listed] == ["start", "stop"]
    bad = cli("instance", "schedule", "add", "box", "--stop", "at seven")
    assert bad.exit_code == 1 and '"0 9 * * 1-5"' in bad.stderr
    assert cli("instance", "schedule", "rm", "box", str(listed[0]["id"])).exit_code == 0
    assert len(json.loads(cli("instance", "schedule", "ls", "box", "-o", "json").stdout)) == 1

    running = cli("instance", "resize", "box", "--gpus", "A100-80GB:1")
    assert running.exit_code == 1 and "stop it first" in running.stderr
    assert cli("instance", "stop", "box").exit_code == 0
    resized = cli("instance", "resize", "box", "--gpus", "A100-80GB:2")
    assert resized.exit_code == 0, resized.output
    assert "A100-80GB:2" in resized.stdout
    assert cli("instance", "resize", "box").exit_code == 2
    started = json.loads(cli("instance", "start", "box", "--no-gpu", "-o", "json").stdout)
    assert (started["gpu_model"], started["gpu_count"]) == ("CPU", 0)
