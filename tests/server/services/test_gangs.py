"""Multi-node runs in the server: a gang's members start together on distinct nodes, each
runner with its rank's variables, or none starts; impossible gangs are refused."""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import IPv4Network
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from factories import Caller, make_node, make_settings
from gpulease.backends.fake import FakeBackend
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Gpu, Instance, Node, Run
from gpulease.server.reconcilers import scheduler
from gpulease.server.runtime import Runtime
from gpulease.server.services.instances import gangs
from gpulease.server.services.instances.states import STARTING, STOPPED, STOPPING, switch_status
from gpulease.server.settings import Settings

MODEL = "A100-80GB"
SECOND_HOST = "10.0.0.2"


@pytest.fixture
def two_nodes(rt: Runtime, ann: Caller) -> dict[int, str]:
    """The fixture's node beside a second one with two A100s: node id -> hostname."""
    make_node(rt, "gpu-2", SECOND_HOST)
    with transaction(rt.sessions) as session:
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


def test_a_rank_released_while_the_tick_places_its_gang_starts_no_rank(
    ann: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner releases rank 1 (another transaction, committed) between the tick's read of
    the queue and its start of the gang: the tick starts neither rank, holds no GPU for
    them and goes on without an error."""
    if not database_url.startswith("postgresql"):
        pytest.skip("two writers at once need PostgreSQL (SQLite takes one at a time)")
    leader = int(str(gang(ann, name="g11")["id"]))
    balance = gangs.ledger.balance

    def released_meanwhile(session: Session, owner_id: int, team_id: int | None) -> int:
        with transaction(rt.sessions) as other:
            rank_1 = gangs.members(other, leader)[1]
            rank_1.status = "released"
        return balance(session, owner_id, team_id)

    monkeypatch.setattr(gangs.ledger, "balance", released_meanwhile)
    assert scheduler.tick(rt) == 0
    monkeypatch.undo()
    assert [m[0] for m in members(rt, leader)] == ["queued", "released"]
    with transaction(rt.sessions) as session:
        ids = [m.id for m in gangs.members(session, leader)]
        assert session.scalars(select(Gpu.id).where(Gpu.instance_id.in_(ids))).all() == []
    tick()  # the next pass is an ordinary one: a run with a released rank ends whole
    assert [m[0] for m in members(rt, leader)] == ["stopped", "released"]


# -- stop, start and release: the whole run, whichever rank they are asked of ---------------


def ranks(caller: Caller, gang_id: int) -> list[dict[str, object]]:
    """The caller's view of the gang's instances, in rank order."""
    got = [i for i in caller.get("/api/v1/instances").json() if i["gang_id"] == gang_id]
    return sorted(got, key=lambda i: int(str(i["gang_rank"])))


def end_runners(rt: Runtime, backend: FakeBackend, gang_id: int, tick: Callable[[], None]) -> None:
    """Every rank's runner has exited, as each does once told to stop; the launcher sees it."""
    with transaction(rt.sessions) as session:
        ids = [m.id for m in gangs.members(session, gang_id)]
    for instance_id in ids:
        handle = backend.handle_for(instance_id)
        if handle is not None:
            backend.set_alive(handle, False)
    tick()


def stopped_gang(
    ann: Caller, rt: Runtime, backend: FakeBackend, tick: Callable[[], None], name: str = "dist"
) -> int:
    """A two-rank run that was placed and then stopped whole: rank 0's id."""
    gang_id = int(str(gang(ann, name=name)["id"]))
    tick()
    assert [m[0] for m in members(rt, gang_id)] == ["starting", "starting"]
    r = ann.post(f"/api/v1/instances/{gang_id}/stop")
    assert r.status_code == 200, r.text
    end_runners(rt, backend, gang_id, tick)
    assert [m[0] for m in members(rt, gang_id)] == ["stopped", "stopped"]
    return gang_id


@pytest.mark.parametrize("asked", [0, 1])
def test_stopping_any_rank_stops_the_whole_run_and_tells_every_rank_why(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
    asked: int,
) -> None:
    gang_id = int(str(gang(ann)["id"]))
    tick()
    name = "dist" if asked == 0 else "dist-1"
    r = ann.post(f"/api/v1/instances/{name}/stop")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "stopping"
    both = ranks(ann, gang_id)
    assert [m["status"] for m in both] == ["stopping", "stopping"]  # at once, not a tick later
    assert both[asked]["status_reason"] == "stopped by its owner"
    other = both[1 - asked]
    assert other["status_reason"] == (
        f"stopped by its owner (with rank {asked} of its multi-node run, which stops as one)"
    )
    end_runners(rt, backend, gang_id, tick)
    both = ranks(ann, gang_id)
    assert [m["status"] for m in both] == ["stopped", "stopped"]
    assert [m["desired_state"] for m in both] == ["stopped", "stopped"]
    assert "with rank" in str(both[1 - asked]["status_reason"])  # kept once stopped


def test_a_queued_run_stops_whole_at_once(
    ann: Caller, rt: Runtime, two_nodes: dict[int, str]
) -> None:
    gang_id = int(str(gang(ann)["id"]))
    r = ann.post("/api/v1/instances/dist-1/stop")
    assert r.status_code == 200 and r.json()["status"] == "stopped", r.text
    assert [m[0] for m in members(rt, gang_id)] == ["stopped", "stopped"]


@pytest.mark.parametrize("asked", ["dist", "dist-1"])
def test_starting_any_rank_queues_the_whole_run_as_one_request_and_it_starts_together(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
    asked: str,
) -> None:
    gang_id = stopped_gang(ann, rt, backend, tick)
    launched = len(backend.started)
    r = ann.post(f"/api/v1/instances/{asked}/start")
    assert r.status_code == 200, r.text
    leader, follower = ranks(ann, gang_id)
    assert (leader["status"], follower["status"]) == ("queued", "queued")
    assert leader["queue_position"] == 1 and follower["queue_position"] is None  # one request
    assert "rank 0 (dist) stands in the queue for its 2 nodes" in str(follower["status_message"])
    assert "dist-1: queued" not in str(follower["status_message"])
    tick()
    placed = members(rt, gang_id)
    assert [m[0] for m in placed] == ["starting", "starting"], placed
    assert len({m[1] for m in placed}) == 2
    again = backend.started[launched:]
    assert sorted(spec.instance_id for spec in again) == sorted(
        int(str(m["id"])) for m in (leader, follower)
    )
    for spec in again:
        assert spec.extra_env["WORLD_SIZE"] == "2"
        assert spec.extra_env["NODE_RANK"] == ("0" if spec.instance_id == gang_id else "1")
    # a start of a run already started is a no-op, as for one instance
    r = ann.post("/api/v1/instances/dist-1/start")
    assert r.status_code == 200 and r.json()["status"] == "starting", r.text


def test_each_rank_goes_back_to_its_own_node_among_those_it_is_given(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
) -> None:
    gang_id = stopped_gang(ann, rt, backend, tick)
    ann.post(f"/api/v1/instances/{gang_id}/start")
    with transaction(rt.sessions) as session:
        homes = [m.last_node_id for m in gangs.members(session, gang_id)]
        assert None not in homes
        free = {
            (n, MODEL): [g.id for g in session.scalars(select(Gpu).where(Gpu.node_id == n))]
            for n in two_nodes
        }
        offered = tuple(reversed([n for n in homes if n is not None]))  # the policy's order
        assert gangs.start_gang(session, gang_id, offered, free) == 2
        assert [m.node_id for m in gangs.members(session, gang_id)] == homes


def test_a_restarted_rank_whose_node_is_full_moves_with_its_workspace_and_its_owner_is_told(
    ann: Caller,
    bob: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
) -> None:
    gang_id = stopped_gang(ann, rt, backend, tick)
    make_node(rt, "gpu-3", "10.0.0.3")
    r = bob.post("/api/v1/instances", json={"gpu": f"{MODEL}:2", "name": "filler"})
    assert r.status_code == 201, r.text
    with transaction(rt.sessions) as session:  # bob's instance holds rank 0's last node
        homes = {m.gang_rank: m.last_node for m in gangs.members(session, gang_id)}
        full, kept = homes[0], homes[1]
        assert full is not None and kept is not None
        full_id, full_name, kept_id = full.id, full.name, kept.id
        filler = session.get(Instance, int(r.json()["id"]))
        assert filler is not None
        for gpu in session.scalars(select(Gpu).where(Gpu.node_id == full_id, Gpu.model == MODEL)):
            gpu.instance_id = filler.id
        filler.node_id = full_id
        switch_status(session, filler, STARTING, "")
    launched = len(backend.started)
    r = ann.post("/api/v1/instances/dist-1/start")
    assert r.status_code == 200, r.text
    tick()
    with transaction(rt.sessions) as session:
        now = [(m.id, m.status, m.node_id) for m in gangs.members(session, gang_id)]
    assert [status for _, status, _ in now] == ["starting", "starting"], now
    assert now[0][2] not in (full_id, kept_id) and now[1][2] == kept_id, now
    specs = {spec.instance_id: spec for spec in backend.started[launched:]}
    assert specs[gang_id].workspace_restore  # rank 0's saved copy is fetched on its new node
    assert not specs[now[1][0]].workspace_restore  # rank 1 is back where its workspace is
    said = [n["message"] for n in ann.get("/api/v1/notifications").json()]
    moved = [m for m in said if m.startswith(f"instance dist moved from {full_name} to gpu-3")]
    assert moved and f"node {full_name} is full" in moved[0], said


def test_a_run_that_cannot_start_whole_is_refused_with_what_to_do(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
) -> None:
    gang_id = int(str(gang(ann)["id"]))
    tick()
    end_rank(rt, gang_id, 1)  # rank 1's run succeeded and it stopped; rank 0 still works
    r = ann.post("/api/v1/instances/dist-1/start")
    assert r.status_code == 409, r.text
    assert "rank 0 (dist) of the multi-node run dist is still starting" in r.json()["detail"]
    assert "`gpulease instance stop dist`" in r.json()["detail"]
    ann.post("/api/v1/instances/dist/stop")  # rank 0's runner has not ended yet
    r = ann.post("/api/v1/instances/dist-1/start")
    assert r.status_code == 409 and "is still stopping" in r.json()["detail"], r.text
    end_runners(rt, backend, gang_id, tick)
    r = ann.post("/api/v1/instances/dist-1/start", json={"no_gpu": True})
    assert r.status_code == 409 and "without --no-gpu" in r.json()["detail"], r.text
    # a rank resized on its own no longer matches the others
    r = ann.post("/api/v1/instances/dist-1/resize", json={"gpu_model": MODEL, "gpu_count": 2})
    assert r.status_code == 200, r.text
    r = ann.post("/api/v1/instances/dist/start")
    assert r.status_code == 409, r.text
    assert f"rank 1 (dist-1) of the multi-node run dist has {MODEL} × 2" in r.json()["detail"]
    ann.post("/api/v1/instances/dist-1/resize", json={"gpu_model": MODEL, "gpu_count": 1})
    # a node that left: the cluster no longer holds the run
    with transaction(rt.sessions) as session:
        node = session.scalars(select(Node).where(Node.name == "gpu-2")).one()
        node.status = "gone"
    r = ann.post("/api/v1/instances/dist/start")
    assert r.status_code == 409, r.text
    assert "2 nodes with A100-80GB × 1 each are needed and 1 has" in r.json()["detail"]
    assert [m[0] for m in members(rt, gang_id)] == ["stopped", "stopped"]  # nothing changed


def test_a_run_missing_a_released_rank_cannot_start(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
) -> None:
    gang_id = stopped_gang(ann, rt, backend, tick)
    with transaction(rt.sessions) as session:  # as a server before whole-run releases left it
        switch_status(session, gangs.members(session, gang_id)[1], "released", "released")
    r = ann.post("/api/v1/instances/dist/start")
    assert r.status_code == 409, r.text
    assert "rank 1 (dist-1) of the multi-node run dist was released" in r.json()["detail"]
    r = ann.post("/api/v1/instances/dist-1/start")
    assert r.status_code == 409, r.text
    assert "instance dist-1 was released; create the run again" in r.json()["detail"]
    assert [m[0] for m in members(rt, gang_id)] == ["stopped", "released"]


@pytest.mark.parametrize("asked", ["dist", "dist-1"])
def test_releasing_any_rank_releases_the_whole_run(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
    asked: str,
) -> None:
    gang_id = int(str(gang(ann)["id"]))
    tick()
    r = ann.post(f"/api/v1/instances/{asked}/release")
    assert r.status_code == 200, r.text
    both = ranks(ann, gang_id)
    assert [(m["status"], m["desired_state"]) for m in both] == [("stopping", "released")] * 2
    told = [str(m["status_reason"]) for m in both if m["name"] != asked]
    assert told == [
        f"released by its owner (with rank {0 if asked == 'dist' else 1} of its multi-node "
        "run, which goes as one)"
    ]
    end_runners(rt, backend, gang_id, tick)
    assert [m[0] for m in members(rt, gang_id)] == ["released", "released"]
    # a stopped run is released whole at once
    second = stopped_gang(ann, rt, backend, tick, name="other")
    r = ann.post("/api/v1/instances/other-1/release")
    assert r.status_code == 200 and r.json()["status"] == "released", r.text
    assert [m[0] for m in members(rt, second)] == ["released", "released"]


def test_another_user_cannot_stop_start_or_release_a_rank(
    ann: Caller,
    bob: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
) -> None:
    gang_id = int(str(gang(ann)["id"]))
    tick()
    rank1 = ranks(ann, gang_id)[1]
    for action in ("stop", "start", "release"):
        for ref in (str(gang_id), str(rank1["id"]), "dist-1"):
            r = bob.post(f"/api/v1/instances/{ref}/{action}")
            assert r.status_code == 404, (action, ref, r.text)
    assert [m[0] for m in members(rt, gang_id)] == ["starting", "starting"]
    r = ann.post("/api/v1/instances/dist-9/stop")  # a rank the run does not have
    assert r.status_code == 404, r.text


def test_a_start_pays_for_every_rank_of_the_run(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    settings: Settings,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
) -> None:
    gang_id = stopped_gang(ann, rt, backend, tick)
    hourly = int(str(ranks(ann, gang_id)[0]["hourly_micro"]))
    balance = int(ann.get("/api/v1/balance").json()["balance_micro"])
    # minutes enough that the wallet pays them for one rank and not for two
    settings.min_start_minutes = balance * 60 * 3 // (4 * hourly)
    r = ann.post("/api/v1/instances/dist-1/start")
    assert r.status_code == 402, r.text
    assert "this run of 2 nodes costs" in r.json()["detail"]
    assert [m[0] for m in members(rt, gang_id)] == ["stopped", "stopped"]
    r = ann.post("/api/v1/instances", json={"gpu": f"{MODEL}:1", "num_nodes": 2, "name": "n"})
    assert r.status_code == 402 and "this run of 2 nodes costs" in r.json()["detail"], r.text
    assert {i["name"] for i in ann.get("/api/v1/instances").json()} == {"dist", "dist-1"}
    r = ann.post("/api/v1/instances", json={"gpu": f"{MODEL}:1", "name": "one"})
    assert r.status_code == 201, r.text  # one rank's worth is there


def test_a_restarted_run_gets_fabric_addresses_again_on_a_full_fabric(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    settings: Settings,
    tick: Callable[[], None],
    two_nodes: dict[int, str],
) -> None:
    settings.fabric_cidr = "10.213.0.0/30"  # two addresses: this gang's, taken at its first start
    gang_id = stopped_gang(ann, rt, backend, tick)
    held = fabric_addresses(rt, gang_id)
    assert sorted(a for a in held if a) == ["10.213.0.1", "10.213.0.2"]
    assert [m["fabric_address"] for m in ranks(ann, gang_id)] == held
    r = ann.post("/api/v1/instances/dist-1/start")
    assert r.status_code == 200, r.text
    tick()
    assert [m[0] for m in members(rt, gang_id)] == ["starting", "starting"]
    assert sorted(str(a) for a in fabric_addresses(rt, gang_id)) == ["10.213.0.1", "10.213.0.2"]
    detail = ann.get("/api/v1/instances/dist-1").json()
    assert detail["fabric_address"] == fabric_addresses(rt, gang_id)[1]
