"""`gpulease instance show` of a rank of a multi-node run: its place in the run, and its
address on the job fabric once it has one."""

from __future__ import annotations

import json

from wired_cli import Cli

from factories import make_node
from gpulease.schemas.instances import InstanceCreate


def test_instance_show_names_a_ranks_place_in_its_run_and_its_fabric_address(cli: Cli) -> None:
    ann = cli.login_as("ann")
    cli.server.rt.settings.fabric_cidr = "10.213.0.0/29"
    make_node(cli.server.rt, "gpu-2", "10.0.0.2")
    leader = ann.instances.create(InstanceCreate(gpu="A100-80GB:1", num_nodes=2, name="dist"))
    queued = cli("instance", "show", "dist-1").stdout
    assert f"rank 1 of 2 (rank 0 is instance {leader.id})" in queued, queued
    assert "rank 0 (dist) stands in the queue for its 2 nodes" in queued
    assert "fabric address" not in queued  # none before its run is placed
    cli.server.cluster.step()
    placed = cli("instance", "show", "dist-1").stdout
    rank1 = ann.instances.get("dist-1")
    assert rank1.fabric_address == "10.213.0.2"
    assert "fabric address" in placed and "10.213.0.2" in placed, placed
    as_json = json.loads(cli("instance", "show", "dist-1", "-o", "json").stdout)
    assert as_json["fabric_address"] == "10.213.0.2"
    alone = cli("instance", "create", "--gpu", "T4:1", "--name", "box")
    assert alone.exit_code == 0, alone.output
    shown = cli("instance", "show", "box").stdout
    assert "multi-node run" not in shown and "fabric address" not in shown
