"""GPU samples: from runners (only their own, real GPUs), from the node's sampler, views."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

from sqlalchemy import select

from factories import Caller, RunnerDouble
from gpulease.gpus.discovery import Nvml
from gpulease.gpus.sampling import GpuReading
from gpulease.server.db import transaction
from gpulease.server.orm import Gpu, GpuSample
from gpulease.server.reconcilers.gpu_samples import sample_gpus
from gpulease.server.runtime import Runtime
from gpulease.server.services import metrics


def _instance_with_real_gpu(
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    rt: Runtime,
) -> tuple[int, str, RunnerDouble]:
    """A running T4 instance whose GPU the node reports as real (tests have only simulated
    GPUs; a GPU row with simulated=False is what NVML discovery writes on a GPU host)."""
    instance_id = int(ann.post("/api/v1/instances", json={"gpu": "T4:1"}).json()["id"])
    tick()
    runner = runner_for(instance_id)
    runner.ready()
    with transaction(rt.sessions) as session:
        gpu = session.scalars(select(Gpu).where(Gpu.instance_id == instance_id)).one()
        gpu.simulated = False
        uuid = gpu.uuid
    return instance_id, uuid, runner


def _sample(uuid: str, at: float, util: float | None = 90.0) -> dict[str, object]:
    return {
        "uuid": uuid,
        "time": at,
        "util_pct": util,
        "memory_used_mb": 1200,
        "memory_total_mb": 15360,
        "power_w": 70.5,
        "temperature_c": None,
    }


def test_a_runner_sends_samples_of_its_own_gpus_only(
    ann: Caller,
    bob: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    rt: Runtime,
) -> None:
    instance_id, uuid, runner = _instance_with_real_gpu(ann, tick, runner_for, rt)
    now = time.time()
    body = {"samples": [_sample(uuid, now - 10, 40.0), _sample(uuid, now, 90.0)]}
    assert runner.call("POST", "/gpu-samples", json=body).status_code == 204
    got = ann.get(f"/api/v1/instances/{instance_id}/gpus").json()
    (gpu,) = got["gpus"]
    assert gpu["uuid"] == uuid and gpu["held"] and not gpu["simulated"]
    assert gpu["latest"]["util_pct"] == 90.0 and gpu["latest"]["temperature_c"] is None
    assert gpu["series"]["util_pct"] == [40.0, 90.0]
    assert got["last_sample_id"] == gpu["latest"]["id"]
    # a GPU of the node that is not the instance's, and a made-up one: refused, nothing kept
    with transaction(rt.sessions) as session:
        other = session.scalars(select(Gpu).where(Gpu.instance_id.is_(None))).first()
        assert other is not None
        other_uuid = other.uuid
    for stranger in (other_uuid, "GPU-00000000-made-up"):
        r = runner.call("POST", "/gpu-samples", json={"samples": [_sample(stranger, now)]})
        assert r.status_code == 403 and "not one of this instance's GPUs" in r.json()["detail"]
    bad = runner.call("POST", "/gpu-samples", json={"samples": [_sample(uuid, now, 250.0)]})
    assert bad.status_code == 422 and "percentage" in bad.json()["detail"]
    assert (
        len(ann.get(f"/api/v1/instances/{instance_id}/gpus").json()["gpus"][0]["series"]["times"])
        == 2
    )
    assert bob.get(f"/api/v1/instances/{instance_id}/gpus").status_code == 404
    with transaction(rt.sessions) as session:
        latest = {g["uuid"]: g for g in metrics.latest_gpu_samples(session)}
    assert len(latest) == 3 and latest[uuid]["instance_id"] == instance_id
    assert latest[uuid]["sample"]["util_pct"] == 90.0
    assert all(g["sample"] is None for u, g in latest.items() if u != uuid)


def test_simulated_gpus_have_no_samples_and_are_marked(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:2"}).json()["id"]
    tick()
    runner = runner_for(instance_id)
    runner.ready()
    gpus = ann.get(f"/api/v1/instances/{instance_id}/gpus").json()["gpus"]
    assert [g["simulated"] for g in gpus] == [True, True]
    assert all(g["latest"] is None and g["series"]["times"] == [] for g in gpus)
    r = runner.call("POST", "/gpu-samples", json={"samples": [_sample(gpus[0]["uuid"], 1.7e9)]})
    assert r.status_code == 403 and "simulated" in r.json()["detail"]


def test_the_gpu_stream_sends_new_samples(
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    rt: Runtime,
) -> None:
    instance_id, uuid, runner = _instance_with_real_gpu(ann, tick, runner_for, rt)
    runner.call("POST", "/gpu-samples", json={"samples": [_sample(uuid, time.time(), 10.0)]})
    url = f"/api/v1/instances/{instance_id}/gpus/stream"
    with ann.http.stream("GET", url, headers=ann.headers, params={"since": 0}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        got: list[float] = []
        event_ids: list[str] = []
        for line in r.iter_lines():
            if line.startswith("id: "):
                event_ids.append(line[4:])
            if line.startswith("data: "):
                got.extend(s["util_pct"] for s in json.loads(line[6:])["samples"])
                if got == [10.0]:
                    body = {"samples": [_sample(uuid, time.time(), 55.0)]}
                    assert runner.call("POST", "/gpu-samples", json=body).status_code == 204
                if len(got) == 2:
                    break
    assert got == [10.0, 55.0]
    assert int(event_ids[-1]) > int(event_ids[0])


def test_the_node_sampler_stores_real_gpus_with_their_instance(
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    rt: Runtime,
) -> None:
    asked: list[list[str]] = []

    def reader(nvml: Nvml | None, uuids: Sequence[str]) -> list[GpuReading]:
        asked.append(list(uuids))
        return [GpuReading(u, time.time(), 33.0, 100, 15360, 30.0, 50.0) for u in uuids]

    assert sample_gpus(rt, reader) == 0  # only simulated GPUs: NVML is not even asked
    assert asked == []
    instance_id, uuid, runner = _instance_with_real_gpu(ann, tick, runner_for, rt)
    assert sample_gpus(rt, reader) == 1
    with transaction(rt.sessions) as session:
        (sample,) = session.scalars(select(GpuSample)).all()
        assert (sample.gpu_uuid, sample.instance_id, sample.util_pct) == (uuid, instance_id, 33.0)
    assert sample_gpus(rt, reader) == 1  # its own samples do not stop it
    # once the runner sends its own samples, the node leaves that GPU to it
    body = {"samples": [_sample(uuid, time.time() + 1, 80.0)]}
    assert runner.call("POST", "/gpu-samples", json=body).status_code == 204
    assert sample_gpus(rt, reader) == 0


def test_the_heatmap_has_a_row_per_gpu_and_a_column_per_bucket(
    ann: Caller,
    admin: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    rt: Runtime,
) -> None:
    _, uuid, runner = _instance_with_real_gpu(ann, tick, runner_for, rt)
    now = time.time()
    samples = [_sample(uuid, now - 1, 20.0), _sample(uuid, now - 2, 40.0)]
    assert runner.call("POST", "/gpu-samples", json={"samples": samples}).status_code == 204
    got = admin.get("/api/v1/admin/gpu-heatmap", params={"minutes": 10, "bucket_s": 60})
    assert got.status_code == 200, got.text
    heat = got.json()
    assert heat["bucket_s"] == 60 and len(heat["buckets"]) == 10
    (node,) = heat["nodes"]
    assert len(node["gpus"]) == 3  # A100-80GB:2,T4:1
    rows = {g["uuid"]: g for g in node["gpus"]}
    assert all(len(g["util"]) == 10 for g in node["gpus"])
    assert rows[uuid]["util"][-1] == 30.0 and rows[uuid]["util"][:-1] == [None] * 9
    assert all(g["simulated"] and set(g["util"]) == {None} for u, g in rows.items() if u != uuid)
    assert ann.get("/api/v1/admin/gpu-heatmap").status_code == 403
    too_many = admin.get("/api/v1/admin/gpu-heatmap", params={"minutes": 10080, "bucket_s": 5})
    assert too_many.status_code == 422 and "larger bucket_s" in too_many.json()["detail"]


def test_gpu_samples_past_their_retention_are_pruned_and_newer_ones_kept(rt: Runtime) -> None:
    """GPULEASE_GPU_SAMPLE_RETENTION_DAYS (30 by default): older samples go, newer stay."""
    from datetime import timedelta

    from gpulease.server.db import utcnow
    from gpulease.server.orm import Node
    from gpulease.server.reconcilers.gpu_samples import prune_samples

    now = utcnow()
    ages = [timedelta(days=40), timedelta(days=31), timedelta(days=29), timedelta(minutes=1)]
    with transaction(rt.sessions) as session:
        node_id = session.scalars(select(Node.id)).first()
        assert node_id is not None
        for age in ages:
            session.add(GpuSample(node_id=node_id, gpu_uuid="GPU-x", time=now - age, util_pct=50.0))
    assert prune_samples(rt, now=now) == 2
    assert prune_samples(rt, now=now) == 0
    with transaction(rt.sessions) as session:
        kept = sorted(session.scalars(select(GpuSample.time)).all())
    assert kept == [now - timedelta(days=29), now - timedelta(minutes=1)]
