"""Spot preemption in the server: the scheduler preempts a spot instance for an on-demand
request, its runner is told the grace, billing ends at the stop, the instance is queued
again with its interrupted run and resumes when GPUs free up; quotas hold starts back."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select

from factories import Caller, RunnerDouble, make_running_instance
from gpulease.server.db import transaction
from gpulease.server.orm import Instance, Run, UsageSegment
from gpulease.server.runtime import Runtime


def _instance(rt: Runtime, instance_id: int) -> Instance:
    with transaction(rt.sessions) as session:
        row = session.get(Instance, instance_id)
        assert row is not None
        session.expunge(row)
        return row


def _segments(rt: Runtime, instance_id: int) -> list[UsageSegment]:
    with transaction(rt.sessions) as session:
        rows = list(
            session.scalars(
                select(UsageSegment)
                .where(UsageSegment.instance_id == instance_id)
                .order_by(UsageSegment.id)
            )
        )
        session.expunge_all()
        return rows


def test_a_spot_instance_is_preempted_with_grace_and_resumes(
    ann: Caller,
    bob: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    spot, runner = make_running_instance(ann, tick, runner_for, gpu="A100-80GB:2", plan="spot")
    r = ann.post(
        f"/api/v1/instances/{spot}/runs",
        json={"command": "python train.py", "stop_instance_on_exit": True, "task_name": "cats"},
    )
    assert r.status_code == 201, r.text
    run_id = int(r.json()["id"])
    assert [c["id"] for c in runner.commands()] == [run_id]
    assert runner.call("POST", f"/runs/{run_id}/started", json={"pid": 2}).status_code == 204
    assert runner.heartbeat() == "continue"

    r = bob.post("/api/v1/instances", json={"gpu": "A100-80GB:1"})
    assert r.status_code == 201, r.text
    od = int(r.json()["id"])
    tick()
    row = _instance(rt, spot)
    assert row.status == "stopping" and row.status_reason.startswith("preempted")
    assert row.preempted_at is not None
    # billing ended at the stop: the grace is not charged
    (seg,) = _segments(rt, spot)
    assert seg.ended_at == row.preempted_at
    charged = seg.charged_micro
    # the runner is told it is a preemption, with the grace, on both channels
    beat = runner.call("POST", "/heartbeat", json={"running_runs": [run_id]}).json()
    assert beat == {"action": "stop", "preempt_grace_s": rt.settings.preempt_grace_s}
    polled = runner.call("GET", "/commands", params={"wait": 0}).json()
    assert polled["stop"] is True and polled["preempt_grace_s"] == rt.settings.preempt_grace_s
    # the on-demand request waits for the GPUs, and nothing more is preempted meanwhile
    shown = bob.get(f"/api/v1/instances/{od}").json()
    assert shown["status"] == "queued" and "give back their GPUs" in shown["status_message"]
    tick()
    assert _instance(rt, spot).status == "stopping"
    assert _segments(rt, spot)[0].charged_micro == charged

    # the job checkpoints and exits in the grace; the runner reports the stop
    assert runner.call("POST", f"/runs/{run_id}/exit", json={"exit_code": 0}).status_code == 204
    runner.stopped()
    tick()
    assert bob.get(f"/api/v1/instances/{od}").json()["status"] == "starting"
    row = _instance(rt, spot)
    assert row.status == "queued" and row.preempted_at is None
    assert row.workspace and row.stop_after_run_id != run_id  # workspace kept, run queued again
    with transaction(rt.sessions) as session:
        again = session.scalars(select(Run).where(Run.instance_id == spot, Run.id != run_id)).one()
        assert (again.command, again.status) == ("python train.py", "pending")
        assert again.task_name == "cats"  # the resumed run is still the task's
        assert again.stop_instance_on_exit
        again_id = again.id
    (seg,) = _segments(rt, spot)
    assert seg.charged_micro == charged  # nothing charged twice, nothing for the grace

    # GPUs free up: the spot instance starts again and its runner gets the run again
    assert bob.post(f"/api/v1/instances/{od}/stop").status_code == 200
    runner_for(od).stopped()
    tick()
    assert _instance(rt, spot).status == "starting"
    second = runner_for(spot)
    assert second.token != runner.token
    second.ready()
    assert [c["id"] for c in second.commands()] == [again_id]
    first, resumed = _segments(rt, spot)
    assert first.charged_micro == charged and resumed.ended_at is None
    assert first.ended_at is not None and resumed.started_at >= first.ended_at


def test_on_demand_and_daily_instances_are_never_preempted(
    ann: Caller,
    bob: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    held, _ = make_running_instance(ann, tick, runner_for, gpu="A100-80GB:2")
    r = bob.post("/api/v1/instances", json={"gpu": "A100-80GB:1"})
    assert r.status_code == 201, r.text
    tick()
    assert _instance(rt, held).status == "running"
    assert _instance(rt, held).preempted_at is None


def test_quotas_cap_concurrency(
    ann: Caller,
    admin: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    assert ann.put("/api/v1/admin/quotas/users/ann", json={"max_gpus": 9}).status_code == 403
    r = admin.put("/api/v1/admin/quotas/users/ann", json={"max_gpus": -1})
    assert r.status_code == 422 and "max_gpus" in r.text
    r = admin.put("/api/v1/admin/quotas/users/nobody", json={"max_gpus": 1})
    assert r.status_code == 404 and "no user 'nobody'" in r.json()["detail"]
    r = admin.put("/api/v1/admin/quotas/users/ann", json={"max_gpus": 1})
    assert r.status_code == 200, r.text
    assert admin.get("/api/v1/admin/quotas").json() == [
        {"kind": "user", "name": "ann", "max_gpus": 1}
    ]
    first, _ = make_running_instance(ann, tick, runner_for, gpu="A100-80GB:1")
    r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1"})
    assert r.status_code == 201, r.text
    second = int(r.json()["id"])
    tick()
    shown = ann.get(f"/api/v1/instances/{second}").json()
    assert shown["status"] == "queued", shown  # a free A100 is there, but not for ann
    assert "per-user quota" in shown["status_message"]
    # the admin lifts the cap: it starts
    assert admin.put("/api/v1/admin/quotas/users/ann", json={"max_gpus": None}).status_code == 200
    tick()
    assert ann.get(f"/api/v1/instances/{second}").json()["status"] == "starting"
    assert _instance(rt, first).status == "running"
