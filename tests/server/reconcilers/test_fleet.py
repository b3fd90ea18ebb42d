"""The fleet reconciler on a fake fleet: nodes join and leave, instances on a gone node end."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from factories import Caller, make_running_instance, make_settings
from gpulease.backends.fake import FakeBackend
from gpulease.backends.fleet import FleetNode
from gpulease.core.catalog import Catalog
from gpulease.core.errors import Unavailable
from gpulease.gpus.discovery import DiscoveredGpu, Inventory
from gpulease.server.db import transaction
from gpulease.server.orm import (
    Instance,
    LedgerEntry,
    LedgerTransaction,
    Node,
    Run,
    UsageSegment,
    User,
)
from gpulease.server.runtime import Runtime, build_runtime
from gpulease.server.services import ledger, metering
from gpulease.server.settings import Settings


def fleet_node(name: str, gpus: int = 2, model: str = "A100-80GB", alive: bool = True) -> FleetNode:
    return FleetNode(
        name=name,
        hostname=f"{name}.cluster",
        cpu_count=8,
        memory_mb=64_000,
        inventory=Inventory(
            driver_version="550.54.15",
            cuda_version="12.4",
            gpus=[
                DiscoveredGpu(i, f"ray:{name}:{i}", model, model, 81920, simulated=True)
                for i in range(gpus)
            ],
        ),
        alive=alive,
    )


class FakeFleet(FakeBackend):
    """The fake backend with a fleet whose nodes a test sets."""

    name = "ray"

    def __init__(self) -> None:
        super().__init__()
        self.fleet: list[FleetNode] = []
        self.answers = True  # False: nodes() raises as for a head that does not answer

    def nodes(self, catalog: Catalog) -> list[FleetNode]:
        if not self.answers:
            raise Unavailable("the Ray cluster did not answer within 10 s")
        return list(self.fleet)


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return make_settings(tmp_path / "home", database_url, backend="ray", ray_address="x:1")


@pytest.fixture
def backend() -> FakeFleet:
    return FakeFleet()


@pytest.fixture
def rt(settings: Settings, backend: FakeFleet) -> Iterator[Runtime]:
    runtime = build_runtime(settings, backend)
    yield runtime
    runtime.engine.dispose()


def owner_id(session: Session, caller: Caller) -> int:
    user_id = session.scalar(select(User.id).where(User.name == caller.name))
    assert user_id is not None
    return user_id


def free_total(caller: Caller, model: str) -> tuple[int, int]:
    entry = next(m for m in caller.get("/api/v1/gpus").json() if m["name"] == model)
    return entry["free"], entry["total"]


def test_the_servers_host_is_no_node_on_a_fleet_backend(rt: Runtime, admin: Caller) -> None:
    assert admin.get("/api/v1/nodes").json() == []


def test_nodes_join_and_leave(
    rt: Runtime, backend: FakeFleet, admin: Caller, ann: Caller, tick, http: TestClient
) -> None:  # type: ignore[no-untyped-def]
    backend.fleet = [fleet_node("gpu-a"), fleet_node("gpu-b", gpus=1, model="T4")]
    tick()
    listed = {n["name"]: n for n in admin.get("/api/v1/nodes").json()}
    assert set(listed) == {"gpu-a", "gpu-b"}
    a = listed["gpu-a"]
    assert (a["status"], a["backend"], a["hostname"], a["cpu_count"]) == (
        "ready",
        "ray",
        "gpu-a.cluster",
        8,
    )
    assert a["driver_version"] == "550.54.15"
    assert free_total(ann, "A100-80GB") == (2, 2)
    assert free_total(ann, "T4") == (1, 1)

    backend.fleet = [fleet_node("gpu-a")]  # gpu-b left (Ray no longer lists it)
    tick()
    listed = {n["name"]: n for n in admin.get("/api/v1/nodes").json()}
    assert listed["gpu-b"]["status"] == "gone"
    assert free_total(ann, "T4") == (0, 0)

    backend.fleet = [fleet_node("gpu-a"), fleet_node("gpu-b", gpus=1, model="T4")]
    tick()  # it came back
    assert {n["name"]: n["status"] for n in admin.get("/api/v1/nodes").json()} == {
        "gpu-a": "ready",
        "gpu-b": "ready",
    }
    assert free_total(ann, "T4") == (1, 1)
    # a node whose GPUs changed is registered again with the new ones
    backend.fleet = [fleet_node("gpu-a", gpus=1), fleet_node("gpu-b", gpus=1, model="T4")]
    tick()
    assert free_total(ann, "A100-80GB") == (1, 1)
    # other users see the catalog counts, never the node list
    assert ann.get("/api/v1/nodes").status_code == 403


def test_an_instance_on_a_node_that_leaves_fails_with_the_reason(
    rt: Runtime, backend: FakeFleet, ann: Caller, tick, runner_for
) -> None:  # type: ignore[no-untyped-def]
    backend.fleet = [fleet_node("gpu-a")]
    tick()
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu="A100-80GB:2")
    spec = backend.started[-1]
    assert spec.node == "gpu-a"  # the launcher tells a fleet backend where to start it
    runner.heartbeat()
    with transaction(rt.sessions) as session:
        instance = session.get(Instance, instance_id)
        assert instance is not None and instance.status == "running"
        last_heartbeat = instance.last_heartbeat_at

    with transaction(rt.sessions) as session:  # the meter billed on past the heartbeat
        segment = metering.open_segment_of(session, instance_id)
        assert segment is not None and last_heartbeat is not None
        metering.charge_open_segments(session, last_heartbeat + timedelta(seconds=95))
        assert segment.billed_seconds > (last_heartbeat - segment.started_at).total_seconds()
        balance_billed_past = ledger.balance(session, owner_id(session, ann))

    backend.fleet = [fleet_node("gpu-a", alive=False)]  # the node died
    tick()
    got = ann.get(f"/api/v1/instances/{instance_id}").json()
    assert got["status"] == "failed"
    assert got["status_reason"] == "node gpu-a left the cluster"
    assert free_total(ann, "A100-80GB") == (0, 0)  # its GPUs are no longer offered
    with transaction(rt.sessions) as session:
        instance = session.get(Instance, instance_id)
        assert instance is not None and instance.stopped_at is not None
        node = session.scalar(select(Node).where(Node.name == "gpu-a"))
        assert node is not None and node.status == "gone"
        ends = session.scalars(
            select(UsageSegment.ended_at).where(UsageSegment.instance_id == instance_id)
        ).all()
        assert ends == [last_heartbeat]  # billed up to the last heartbeat, not the tick
        (segment,) = session.scalars(
            select(UsageSegment).where(UsageSegment.instance_id == instance_id)
        ).all()
        held = math.floor((last_heartbeat - segment.started_at).total_seconds())
        assert segment.billed_seconds == held
        assert segment.charged_micro == metering.segment_price(segment, held)
        charged = -session.scalar(
            select(func.sum(LedgerEntry.amount))
            .join(LedgerTransaction)
            .where(
                LedgerTransaction.instance_id == instance_id,
                LedgerEntry.account_id == ledger.wallet_account(session, segment.owner_id, None),
            )
        )
        assert charged == segment.charged_micro  # what was billed past the end came back
        refund = ledger.balance(session, segment.owner_id) - balance_billed_past
        assert refund == metering.segment_price(segment, 95 + held) - segment.charged_micro > 0


def test_a_cluster_that_does_not_answer_marks_nothing_gone(
    rt: Runtime, backend: FakeFleet, ann: Caller, tick, runner_for
) -> None:  # type: ignore[no-untyped-def]
    backend.fleet = [fleet_node("gpu-a")]
    tick()
    instance_id, _runner = make_running_instance(ann, tick, runner_for, gpu="A100-80GB:1")
    backend.answers = False
    tick()
    assert ann.get(f"/api/v1/instances/{instance_id}").json()["status"] == "running"
    assert free_total(ann, "A100-80GB") == (1, 2)


def test_a_spot_instance_on_a_node_that_leaves_is_queued_again_with_its_run(
    rt: Runtime, backend: FakeFleet, ann: Caller, tick, runner_for
) -> None:  # type: ignore[no-untyped-def]
    backend.fleet = [fleet_node("gpu-a", gpus=1), fleet_node("gpu-b", gpus=1)]
    tick()
    instance_id, runner = make_running_instance(
        ann, tick, runner_for, gpu="A100-80GB:1", plan="spot"
    )
    r = ann.post(
        f"/api/v1/instances/{instance_id}/runs",
        json={"command": "python train.py", "stop_instance_on_exit": True},
    )
    run_id = int(r.json()["id"])
    assert runner.call("POST", f"/runs/{run_id}/started", json={"pid": 2}).status_code == 204
    runner.heartbeat()
    dead = backend.started[-1].node
    backend.fleet = [fleet_node(n, gpus=1, alive=n != dead) for n in ("gpu-a", "gpu-b")]
    tick()  # the node goes; the next scheduler pass queues it again and places it
    tick()
    got = ann.get(f"/api/v1/instances/{instance_id}").json()
    assert got["status"] == "starting", got
    assert got["node"] != dead
    assert backend.started[-1].node == got["node"]
    with transaction(rt.sessions) as session:
        runs = session.scalars(
            select(Run).where(Run.instance_id == instance_id).order_by(Run.id)
        ).all()
        assert [(r.status, r.status_reason) for r in runs] == [
            ("failed", f"node {dead} left the cluster"),
            ("pending", ""),
        ]
        assert runs[1].command == "python train.py" and runs[1].stop_instance_on_exit
    second = runner_for(instance_id)
    second.ready()
    assert [c["id"] for c in second.commands()] == [runs[1].id]
