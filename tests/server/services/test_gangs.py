"""Multi-node runs in the server: a gang's members start together on distinct nodes, each
runner with its rank's variables, or none starts; impossible gangs are refused."""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import IPv4Network
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from factories import Caller, make_settings
from gpulease.backends.fake import FakeBackend
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Gpu, Instance, Node, Run
from gpulease.server.runtime import Runtime
from gpulease.server.services.instances import gangs
from gpulease.server.services.instances.states import STOPPED, STOPPING, switch_status
from gpulease.server.settings import Settings

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


def gang(
    caller: Caller, nodes: int = 2, gpu: str = f"{MODEL}:1", name: str = "dist"
) -> dict[str, object]:
    r = caller.post("/api/v1/instances", json={"gpu": gpu, "num_nodes": nodes, "name": name})
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


# -- the job fabric (GPULEASE_FABRIC_CIDR): each rank's own address ------------------------


@pytest.fixture
def fabric(settings: Settings) -> str:
    """A job fabric of 6 addresses (10.213.0.1 to .6) on this test's server."""
    settings.fabric_cidr = "10.213.0.0/29"
    return settings.fabric_cidr


def fabric_addresses(rt: Runtime, gang_id: int) -> list[str | None]:
    with transaction(rt.sessions) as session:
        return [m.fabric_address for m in gangs.members(session, gang_id)]


def end_rank(rt: Runtime, gang_id: int, rank: int) -> None:
    """The rank's run succeeded and it stopped: the gang's other ranks carry on."""
    with transaction(rt.sessions) as session:
        member = gangs.members(session, gang_id)[rank]
        session.add(
            Run(
                instance_id=member.id,
                owner_id=member.owner_id,
                command="python train.py",
                status="succeeded",
                created_at=utcnow(),
            )
        )
        switch_status(session, member, STOPPED, "its run succeeded")


def test_on_a_fabric_each_rank_gets_its_own_address_and_the_variables_name_them(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
    fabric: str,
) -> None:
    first = int(str(gang(ann, name="g1")["id"]))
    second = int(str(gang(ann, name="g2")["id"]))  # each node has two GPUs: both gangs fit
    tick()
    assert fabric_addresses(rt, first) == ["10.213.0.1", "10.213.0.2"]
    assert fabric_addresses(rt, second) == ["10.213.0.3", "10.213.0.4"]
    specs = {spec.instance_id: spec for spec in backend.started}
    assert len(specs) == 4
    with transaction(rt.sessions) as session:
        ranks = {m.id: m.fabric_address for m in gangs.members(session, first)}
    for instance_id, address in ranks.items():
        spec = specs[instance_id]
        env = spec.extra_env
        assert env["MASTER_ADDR"] == "10.213.0.1"
        assert env["SKYPILOT_NODE_IPS"].splitlines() == ["10.213.0.1", "10.213.0.2"]
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "fabric0"
        assert spec.fabric is not None
        assert spec.fabric.address == f"{address}/29"
        assert spec.fabric.peers == tuple(a for a in ranks.values() if a != address)
        assert spec.fabric.interface == "fabric0"
        assert spec.fabric.parent is None  # the node's own setting, filled there


def test_without_a_fabric_the_ranks_get_node_addresses_and_no_link(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
) -> None:
    gang_id = int(str(gang(ann, name="g3")["id"]))
    tick()
    assert fabric_addresses(rt, gang_id) == [None, None]
    for spec in backend.started:
        assert spec.fabric is None
        assert "GLOO_SOCKET_IFNAME" not in spec.extra_env
        ips = spec.extra_env["SKYPILOT_NODE_IPS"].splitlines()
        assert len(ips) == 2 and set(ips) == set(two_nodes.values())
        assert spec.extra_env["MASTER_ADDR"] == ips[0]


def test_fabric_addresses_are_freed_once_no_rank_of_their_gang_is_live(
    ann: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
    fabric: str,
) -> None:
    first = int(str(gang(ann, name="g4")["id"]))
    tick()
    assert fabric_addresses(rt, first) == ["10.213.0.1", "10.213.0.2"]
    # rank 1 ended, rank 0 still runs and still allows .2: nobody else may get .2
    end_rank(rt, first, 1)
    second = int(str(gang(ann, name="g5")["id"]))
    tick()
    assert [m[0] for m in members(rt, first)] == ["starting", "stopped"]
    assert fabric_addresses(rt, second) == ["10.213.0.3", "10.213.0.4"]
    end_rank(rt, first, 0)
    end_rank(rt, second, 0)
    end_rank(rt, second, 1)
    third = int(str(gang(ann, name="g6")["id"]))
    tick()
    assert fabric_addresses(rt, third) == ["10.213.0.1", "10.213.0.2"]
    assert fabric_addresses(rt, first) == [None, None]  # given back
    assert fabric_addresses(rt, second) == [None, None]


def test_an_exhausted_fabric_keeps_the_gang_waiting_with_the_reason(
    ann: Caller,
    rt: Runtime,
    settings: Settings,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
) -> None:
    settings.fabric_cidr = "10.213.0.0/30"  # two addresses: one gang of two
    first = int(str(gang(ann, name="g7")["id"]))
    second = int(str(gang(ann, name="g8")["id"]))
    tick()
    assert fabric_addresses(rt, first) == ["10.213.0.1", "10.213.0.2"]
    assert [m[0] for m in members(rt, second)] == ["queued", "queued"]
    message = str(ann.get(f"/api/v1/instances/{second}").json()["status_message"])
    assert "the job fabric 10.213.0.0/30 has 2 addresses and 2 are held" in message, message
    assert "GPULEASE_FABRIC_CIDR" in message
    end_rank(rt, first, 0)
    end_rank(rt, first, 1)
    tick()
    assert fabric_addresses(rt, second) == ["10.213.0.1", "10.213.0.2"]
    # a run with more ranks than the fabric holds is refused when it is made
    r = ann.post("/api/v1/instances", json={"gpu": f"{MODEL}:1", "num_nodes": 3})
    assert r.status_code == 422, r.text
    assert "the job fabric 10.213.0.0/30 holds 2 ranks" in r.json()["detail"]


@pytest.mark.parametrize("cidr", ["10.213.0.1/16", "fabric", "10.213.0.0/31", "fd00::/64"])
def test_a_bad_fabric_range_is_refused_at_start(tmp_path: Path, cidr: str) -> None:
    with pytest.raises(ValueError, match="GPULEASE_FABRIC_CIDR"):
        make_settings(tmp_path, "sqlite://", fabric_cidr=cidr)


def test_an_address_another_replica_gave_meanwhile_is_not_given_twice(
    ann: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
    fabric: str,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two replicas place two gangs at once: the second to write its addresses is refused
    by the database (one holder per address) and places its gang at the next pass."""
    if not database_url.startswith("postgresql"):
        pytest.skip("two writers at once need PostgreSQL (SQLite takes one at a time)")
    mine = int(str(gang(ann, name="g9")["id"]))
    theirs = int(str(gang(ann, name="g10")["id"]))
    found = gangs.free_fabric_addresses

    def meanwhile(session: Session, network: IPv4Network, wanted: int) -> list[str]:
        free = found(session, network, wanted)
        with transaction(rt.sessions) as other:  # the other replica, committed first
            for member, address in zip(gangs.members(other, theirs), free, strict=False):
                member.fabric_address = address
        return free

    monkeypatch.setattr(gangs, "free_fabric_addresses", meanwhile)
    tick()
    assert [m[0] for m in members(rt, mine)] == ["queued", "queued"]
    assert fabric_addresses(rt, mine) == [None, None]
    # the refusal cost only that gang's placement: the pass went on with the next one
    assert [m[0] for m in members(rt, theirs)] == ["starting", "starting"]
    monkeypatch.undo()
    tick()
    placed = fabric_addresses(rt, mine) + fabric_addresses(rt, theirs)
    assert None not in placed and len(set(placed)) == 4, placed
