"""CLI catalog and instance commands: tables for people, JSON for scripts, refusals as errors."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from wired_cli import Cli

from gpulease.cli import instances as instances_cli
from gpulease.cli.output import when


def test_gpus_table_marks_simulated_counts_and_json_is_the_api_answer(cli: Cli) -> None:
    cli.login_as("ann")
    table = cli("gpus")
    assert table.exit_code == 0
    a100 = next(line for line in table.stdout.splitlines() if "A100-80GB" in line)
    assert "2/2 (simulated)" in a100 and "80 GB" in a100 and "$" in a100
    models = {m["name"]: m for m in json.loads(cli("gpus", "-o", "json").stdout)}
    assert (models["T4"]["free"], models["T4"]["total"], models["T4"]["simulated"]) == (1, 1, 1)


def test_templates_and_admin_only_nodes(cli: Cli) -> None:
    cli.login_as("ann")
    assert "pytorch" in cli("templates").stdout
    assert [t["name"] for t in json.loads(cli("templates", "-o", "json").stdout)]
    refused = cli("nodes")
    assert refused.exit_code == 1 and refused.stderr == "error: this needs an admin account\n"

    cli.login_as_admin()
    nodes = cli("nodes")
    assert "test-node" in nodes.stdout and "(simulated)" in nodes.stdout
    (node,) = json.loads(cli("nodes", "-o", "json").stdout)
    assert len(node["gpus"]) == 3


def test_instance_create_list_show_stop_start_release(cli: Cli) -> None:
    cli.login_as("ann")
    created = cli("instance", "create", "--gpu", "T4:1", "--name", "box")
    assert created.exit_code == 0, created.output
    assert "box" in created.stdout and "queued, being placed on a node" in created.stdout

    listed = cli("instance", "ls")
    assert "box" in listed.stdout and "queued (#1)" in listed.stdout
    (row,) = json.loads(cli("instance", "ls", "-o", "json").stdout)
    assert (row["name"], row["gpu_model"], row["gpu_count"]) == ("box", "T4", 1)

    shown = cli("instance", "show", str(row["id"]))
    assert "T4:1" in shown.stdout and "pytorch" in shown.stdout
    assert json.loads(cli("instance", "show", "box", "-o", "json").stdout)["id"] == row["id"]

    assert "stopped" in cli("instance", "stop", "box").stdout
    assert "queued" in cli("instance", "start", "box").stdout
    released = json.loads(cli("instance", "release", "box", "-o", "json").stdout)
    assert released["status"] == "released"
    assert "no instances" in cli("instance", "ls").stderr
    assert len(json.loads(cli("instance", "ls", "--all", "-o", "json").stdout)) == 1


def test_instance_refusals_print_the_server_message(cli: Cli) -> None:
    cli.login_as("ann")
    missing = cli("instance", "show", "nope")
    assert missing.exit_code == 1
    assert missing.stderr.startswith("error: you have no instance 'nope'")
    too_big = cli("instance", "create", "--gpu", "A100-80GB:3")
    assert too_big.exit_code == 1 and "does not fit on any node" in too_big.stderr
    bad_count = cli("instance", "create", "--gpu", "T4:0")
    assert bad_count.exit_code == 1 and "at least 1" in bad_count.stderr


def test_instance_create_wait_polls_until_running(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli.login_as("ann")
    # The cluster starts at the CLI's first wait between polls, which comes only after it
    # has seen the instance queued and said so: no timer to lose on a loaded machine.
    started: list[bool] = []

    def sleep_then_start(seconds: float) -> None:
        if not started:
            started.append(True)
            cli.server.cluster.start()
        time.sleep(seconds)

    monkeypatch.setattr(instances_cli, "time", SimpleNamespace(sleep=sleep_then_start))
    created = cli("instance", "create", "--gpu", "A100-80GB:2", "--name", "big", "--wait")
    assert started and created.exit_code == 0, created.output
    assert "big: running" in created.stdout
    assert "instance big: queued" in created.stderr  # progress, once per change, on stderr


def test_instance_create_wait_fails_when_it_cannot_start(cli: Cli) -> None:
    ann = cli.login_as("ann")
    cli.server.backend.start_error = RuntimeError("no runner binary")
    cli.server.cluster.start()
    created = cli("instance", "create", "--gpu", "T4:1", "--name", "box", "--wait")
    assert created.exit_code == 1
    assert "did not start" in created.stderr and "no runner binary" in created.stderr
    assert ann.instances.get("box").status == "failed"


def test_a_queued_instance_shows_its_place_reason_and_estimated_start(cli: Cli) -> None:
    ann = cli.login_as("ann")
    made = cli(
        "instance", "create", "--gpu", "A100-80GB:2", "--name", "first", "--max-duration", "2h"
    )
    assert made.exit_code == 0, made.output
    for _ in range(3):
        cli.server.cluster.step()
    assert ann.instances.get("first").status == "running"
    assert cli("instance", "create", "--gpu", "A100-80GB:2", "--name", "second").exit_code == 0
    cli.server.cluster.step()
    second = ann.instances.get("second")
    assert second.status == "queued" and second.queue_eta is not None

    listed = cli("instance", "ls")
    assert "EST. START" in listed.stdout and when(second.queue_eta) in listed.stdout
    shown = cli("instance", "show", "second").stdout
    assert "queue place" in shown and "needs 2 × A100-80GB on one node" in shown
    assert when(second.queue_eta) in shown
    assert "expected ends of 1 of the 1 instance holding A100-80GB (1 declared)" in shown
    assert "no duration known" in shown
    assert "declared 2 h" in cli("instance", "show", "first").stdout
    as_json = json.loads(cli("instance", "show", "second", "-o", "json").stdout)
    assert as_json["queue_reason"] == second.queue_reason

    bad = cli("instance", "create", "--gpu", "T4:1", "--max-duration", "120")
    assert bad.exit_code == 2 and "write it with units, e.g. 2h" in bad.stderr
    both = cli("instance", "create", "--gpu", "T4:1", "--max-duration", "2h", "--max-runtime", "5")
    assert both.exit_code == 2 and "not both" in both.stderr
