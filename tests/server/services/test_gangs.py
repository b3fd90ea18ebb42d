"""Multi-node runs in the server: a gang's members start together on distinct nodes, each
runner with its rank's variables, or none starts; impossible gangs are refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import select

from factories import Caller
from gpulease.backends.fake import FakeBackend
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Gpu, Instance, Node, Run
from gpulease.server.runtime import Runtime
from gpulease.server.services.instances.states import STOPPING, switch_status

MODEL = "A100-80GB"
SECOND_HOST = "10.0.0.2"


@pytest.fixture
def two_nodes(rt: Runtime, ann: Caller) -> dict[int, str]:
    """The fixture's node beside a second one with two A100s: node id -> hostname."""
    with transaction(rt.sessions) as session:
        now = utcnow()
        node = Node(
            name="gpu-2",
            backend="fake",
            hostname=SECOND_HOST,
            status="ready",
            registered_at=now,
            last_seen_at=now,
        )
        session.add(node)
        session.flush()
        for index in range(2):
            session.add(
                Gpu(
                    node_id=node.id,
                    index=index,
                    uuid=f"sim-gpu-2-{index}",
                    nvml_name=MODEL,
                    model=MODEL,
                    memory_mb=81920,
                    simulated=True,
                )
            )
        return {n.id: n.hostname for n in session.scalars(select(Node))}


def gang(caller: Caller, nodes: int = 2, gpu: str = f"{MODEL}:1") -> dict[str, object]:
    r = caller.post("/api/v1/instances", json={"gpu": gpu, "num_nodes": nodes, "name": "dist"})
    assert r.status_code == 201, r.text
    body: dict[str, object] = r.json()
    return body


def members(rt: Runtime, gang_id: int) -> list[tuple[str, int | None, int | None]]:
    with transaction(rt.sessions) as session:
        return [
            (i.status, i.node_id, i.gang_rank)
            for i in session.scalars(
                select(Instance).where(Instance.gang_id == gang_id).order_by(Instance.gang_rank)
            )
        ]


def test_a_gang_starts_together_on_distinct_nodes_with_rank_variables(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
) -> None:
    leader = gang(ann)
    assert (leader["gang_rank"], leader["gang_size"], leader["name"]) == (0, 2, "dist")
    gang_id = int(str(leader["id"]))
    assert [m[0] for m in members(rt, gang_id)] == ["queued", "queued"]
    tick()
    placed = members(rt, gang_id)
    assert all(m[0] in ("starting", "running") for m in placed), placed
    node_ids = [m[1] for m in placed]
    assert len(set(node_ids)) == 2 and None not in node_ids
    envs = {spec.instance_id: spec.extra_env for spec in backend.started}
    assert len(envs) == 2
    hosts = [two_nodes[n] for n in node_ids if n is not None]
    for rank, env in enumerate(envs[i] for i in sorted(envs)):
        assert env["NODE_RANK"] == env["SKYPILOT_NODE_RANK"] == str(rank)
        assert env["MASTER_ADDR"] == hosts[0]
        assert env["SKYPILOT_NODE_IPS"].splitlines() == hosts
        assert env["WORLD_SIZE"] == env["NNODES"] == env["SKYPILOT_NUM_NODES"] == "2"
        assert env["SKYPILOT_NUM_GPUS_PER_NODE"] == "1"
        assert env["SKYPILOT_TASK_ID"] == f"gpulease-gang-{gang_id}"
        assert env["MASTER_PORT"] == envs[gang_id]["MASTER_PORT"]


def test_with_one_node_free_no_member_starts(
    ann: Caller, bob: Caller, rt: Runtime, tick: Callable[[], None], two_nodes: dict[int, str]
) -> None:
    r = bob.post("/api/v1/instances", json={"gpu": f"{MODEL}:2"})
    assert r.status_code == 201, r.text
    tick()  # bob fills one node
    leader = gang(ann, gpu=f"{MODEL}:2")
    gang_id = int(str(leader["id"]))
    tick()
    assert [m[0] for m in members(rt, gang_id)] == ["queued", "queued"]
    message = str(ann.get(f"/api/v1/instances/{gang_id}").json()["status_message"])
    assert "needs 2 nodes" in message


def test_a_gang_larger_than_the_cluster_is_refused(ann: Caller, two_nodes: dict[int, str]) -> None:
    r = ann.post("/api/v1/instances", json={"gpu": f"{MODEL}:1", "num_nodes": 3})
    assert r.status_code in (409, 503), r.text
    assert "3 nodes with A100-80GB × 1 each are needed and 2 have" in r.json()["detail"]
    for plan in ("daily", "spot"):
        body = {"gpu": f"{MODEL}:1", "num_nodes": 2, "plan": plan}
        r = ann.post("/api/v1/instances", json=body)
        assert r.status_code == 422 and f"not {plan}" in r.json()["detail"], r.text
    assert ann.get("/api/v1/instances").json() == []


@pytest.mark.parametrize("run_status", ["failed", "succeeded"])
def test_a_rank_that_ends_without_success_stops_the_other_ranks(
    ann: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
    run_status: str,
) -> None:
    gang_id = int(str(gang(ann)["id"]))
    tick()
    assert [m[0] for m in members(rt, gang_id)] == ["starting", "starting"]
    with transaction(rt.sessions) as session:
        rank1 = session.scalars(
            select(Instance).where(Instance.gang_id == gang_id, Instance.gang_rank == 1)
        ).one()
        session.add(
            Run(
                instance_id=rank1.id,
                owner_id=rank1.owner_id,
                command="python train.py",
                status=run_status,
                created_at=utcnow(),
            )
        )
        switch_status(session, rank1, STOPPING, f"its run {run_status}")
    tick()
    leader = ann.get(f"/api/v1/instances/{gang_id}").json()
    if run_status == "succeeded":  # rank 0 finishes its own work
        assert leader["status"] == "starting", leader
    else:
        assert leader["status"] in ("stopping", "stopped"), leader
        assert leader["status_reason"] == "rank 1 of its run ended: its run failed"
