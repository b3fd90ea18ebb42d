"""GPU samples: readings from runners and from each node's own sampler, views of them."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpulease.core.errors import Forbidden, InvalidInput
from gpulease.schemas.metrics import (
    GpuHeatmap,
    GpuSamplePublic,
    GpuSeries,
    HeatmapGpu,
    HeatmapNode,
    InstanceGpu,
    InstanceGpus,
)
from gpulease.server.db import utcnow
from gpulease.server.orm import Gpu, GpuSample, Instance, Node
from gpulease.server.services.metrics.downsample import bucket_means

log = logging.getLogger(__name__)
MAX_SAMPLES = 1000
MAX_HEATMAP_BUCKETS = 1440
LATEST_MAX_AGE = timedelta(minutes=5)
_EARLIEST, _LATEST = 946_684_800.0, 4_102_444_800.0
READINGS = ("util_pct", "memory_used_mb", "memory_total_mb", "power_w", "temperature_c")


@dataclass(frozen=True)
class GpuReadingIn:
    """One GPU's reading; time in Unix seconds; any measurement may be missing (None)."""

    uuid: str
    time: float
    util_pct: float | None = None
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None


def _check(index: int, r: GpuReadingIn) -> None:
    where = f"sample {index} (GPU {r.uuid})"
    if not (math.isfinite(r.time) and _EARLIEST <= r.time <= _LATEST):
        raise InvalidInput(f"{where}: time must be Unix seconds (as time.time() gives)")
    for name in READINGS:
        value = getattr(r, name)
        if value is None:
            continue
        if not math.isfinite(value) or value < 0:
            raise InvalidInput(f"{where}: {name} must be a finite number ≥ 0, or null")
    if r.util_pct is not None and r.util_pct > 100:
        raise InvalidInput(f"{where}: util_pct is a percentage (0 to 100)")


def _store(
    session: Session, readings: Sequence[GpuReadingIn], gpus: dict[str, Gpu]
) -> list[GpuSample]:
    stored = []
    for r in readings:
        gpu = gpus[r.uuid]
        sample = GpuSample(
            node_id=gpu.node_id,
            gpu_uuid=r.uuid,
            instance_id=gpu.instance_id,
            time=datetime.fromtimestamp(r.time, UTC),
            util_pct=r.util_pct,
            memory_used_mb=r.memory_used_mb,
            memory_total_mb=r.memory_total_mb,
            power_w=r.power_w,
            temperature_c=r.temperature_c,
        )
        session.add(sample)
        stored.append(sample)
    session.flush()
    return stored


def ingest_instance_samples(
    session: Session, instance: Instance, readings: Sequence[GpuReadingIn]
) -> int:
    """Readings a runner took of its instance's GPUs. A GPU the instance does not hold, or a
    simulated one (which has nothing to read), refuses the whole batch."""
    if len(readings) > MAX_SAMPLES:
        raise InvalidInput(f"{len(readings)} samples in one batch; send at most {MAX_SAMPLES}")
    held = {g.uuid: g for g in session.scalars(select(Gpu).where(Gpu.instance_id == instance.id))}
    for i, r in enumerate(readings):
        gpu = held.get(r.uuid)
        if gpu is None:
            mine = ", ".join(sorted(held)) or "none"
            raise Forbidden(
                f"sample {i}: GPU {r.uuid} is not one of this instance's GPUs ({mine}); "
                "send samples only for the GPUs in CUDA_VISIBLE_DEVICES"
            )
        if gpu.simulated:
            raise Forbidden(
                f"sample {i}: GPU {r.uuid} is simulated and has no readings; send none for it"
            )
        _check(i, r)
    return len(_store(session, readings, held))


def ingest_node_readings(session: Session, node_id: int, readings: Sequence[GpuReadingIn]) -> int:
    """Readings a node's own sampler took of its real GPUs, each stored with the instance
    that holds the GPU now. Readings of GPUs the node does not have (or simulated ones) are
    left out."""
    gpus = {
        g.uuid: g
        for g in session.scalars(
            select(Gpu).where(Gpu.node_id == node_id, Gpu.simulated.is_(False))
        )
    }
    usable = []
    for i, r in enumerate(readings):
        if r.uuid not in gpus:
            continue
        try:
            _check(i, r)
        except InvalidInput as exc:
            log.warning("a reading of GPU %s is left out: %s", r.uuid, exc.message)
            continue
        usable.append(r)
    return len(_store(session, usable, gpus))


def real_gpu_uuids(session: Session, node_name: str) -> tuple[int | None, list[str]]:
    """The node's id and the uuids of its present, real GPUs (none: nothing to sample)."""
    node = session.scalar(select(Node).where(Node.name == node_name))
    if node is None:
        return None, []
    uuids = session.scalars(
        select(Gpu.uuid)
        .where(Gpu.node_id == node.id, Gpu.present.is_(True), Gpu.simulated.is_(False))
        .order_by(Gpu.index)
    )
    return node.id, list(uuids)


def newest_sample_times(
    session: Session, node_id: int, uuids: Sequence[str], since: datetime
) -> dict[str, datetime]:
    rows = session.execute(
        select(GpuSample.gpu_uuid, func.max(GpuSample.time))
        .where(
            GpuSample.node_id == node_id,
            GpuSample.time >= since,
            GpuSample.gpu_uuid.in_(list(uuids)),
        )
        .group_by(GpuSample.gpu_uuid)
    ).all()
    return {str(uuid): time for uuid, time in rows if time is not None}


def sample_public(s: GpuSample) -> GpuSamplePublic:
    return GpuSamplePublic(
        id=s.id,
        uuid=s.gpu_uuid,
        instance_id=s.instance_id,
        time=s.time.timestamp(),
        util_pct=s.util_pct,
        memory_used_mb=s.memory_used_mb,
        memory_total_mb=s.memory_total_mb,
        power_w=s.power_w,
        temperature_c=s.temperature_c,
    )


def _gpu_public(g: Gpu) -> dict[str, Any]:
    return {
        "uuid": g.uuid,
        "index": g.index,
        "model": g.model,
        "nvml_name": g.nvml_name,
        "memory_mb": g.memory_mb,
        "simulated": g.simulated,
    }


def latest_gpu_samples(
    session: Session, node_ids: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """Every present GPU (of the given nodes, or of all) with its newest sample of the last
    five minutes, or None (a simulated GPU always has None). Shape of one item:

        {"node_id": 1, "node": "gpu-host-1", "uuid": "GPU-…", "index": 0, "model": "A100-80GB",
         "nvml_name": "…", "memory_mb": 81920, "simulated": false, "instance_id": 7 | null,
         "sample": {"id", "uuid", "instance_id", "time", "util_pct", "memory_used_mb",
                    "memory_total_mb", "power_w", "temperature_c"} | null}
    """
    query = select(Gpu, Node.name).join(Node, Node.id == Gpu.node_id).where(Gpu.present.is_(True))
    if node_ids is not None:
        query = query.where(Gpu.node_id.in_(list(node_ids)))
    gpus = session.execute(query.order_by(Gpu.node_id, Gpu.index)).all()
    since = utcnow() - LATEST_MAX_AGE
    nodes = sorted({gpu.node_id for gpu, _ in gpus})  # so the (node_id, time) index serves
    newest = (
        select(GpuSample.gpu_uuid, func.max(GpuSample.id).label("id"))
        .where(GpuSample.node_id.in_(nodes), GpuSample.time >= since)
        .group_by(GpuSample.gpu_uuid)
    )
    sub = newest.subquery()
    samples = {
        s.gpu_uuid: s
        for s in session.scalars(select(GpuSample).join(sub, GpuSample.id == sub.c.id))
    }
    result = []
    for gpu, node_name in gpus:
        sample = None if gpu.simulated else samples.get(gpu.uuid)
        result.append(
            {
                "node_id": gpu.node_id,
                "node": node_name,
                **_gpu_public(gpu),
                "instance_id": gpu.instance_id,
                "sample": sample_public(sample).model_dump() if sample is not None else None,
            }
        )
    return result


def check_window(minutes: int, limit: int = 7 * 24 * 60) -> int:
    if not 1 <= minutes <= limit:
        raise InvalidInput(f"minutes must be from 1 to {limit}")
    return minutes


def instance_gpus(
    session: Session, instance: Instance, minutes: int = 15, max_points: int = 300
) -> InstanceGpus:
    """The GPUs the instance holds (or held within the window) with their newest sample and
    their readings of the last `minutes`, averaged down to at most max_points. A simulated
    GPU is flagged `simulated`, with no latest sample and empty series."""
    check_window(minutes)
    since = utcnow() - timedelta(minutes=minutes)
    samples = list(
        session.scalars(
            select(GpuSample)
            .where(GpuSample.instance_id == instance.id, GpuSample.time >= since)
            .order_by(GpuSample.time, GpuSample.id)
        )
    )
    held = list(session.scalars(select(Gpu).where(Gpu.instance_id == instance.id)))
    uuids = {g.uuid for g in held} | {s.gpu_uuid for s in samples}
    gpus = {g.uuid: g for g in session.scalars(select(Gpu).where(Gpu.uuid.in_(uuids)))}
    per_gpu: dict[str, list[GpuSample]] = {}
    for s in samples:
        per_gpu.setdefault(s.gpu_uuid, []).append(s)
    result = []
    for uuid in sorted(uuids, key=lambda u: (gpus[u].index if u in gpus else 1 << 30, u)):
        gpu = gpus.get(uuid)
        mine = [] if gpu is not None and gpu.simulated else per_gpu.get(uuid, [])
        times = [s.time.timestamp() for s in mine]
        series: dict[str, list[Any]] = {}
        for name in ("util_pct", "memory_used_mb", "power_w", "temperature_c"):
            t, v = bucket_means(times, [getattr(s, name) for s in mine], max_points)
            series["times"] = t
            series[name] = v
        if not mine:
            series["times"] = []
        public = _gpu_public(gpu) if gpu is not None else {"uuid": uuid, "simulated": False}
        result.append(
            InstanceGpu(
                **public,
                held=gpu is not None and gpu.instance_id == instance.id,
                latest=sample_public(mine[-1]) if mine else None,
                series=GpuSeries(**series),
            )
        )
    return InstanceGpus(
        instance_id=instance.id,
        minutes=minutes,
        last_sample_id=last_instance_sample_id(session, instance),
        gpus=result,
    )


def last_instance_sample_id(session: Session, instance: Instance) -> int:
    found = session.scalar(
        select(func.max(GpuSample.id)).where(GpuSample.instance_id == instance.id)
    )
    return int(found or 0)


def instance_samples_after(
    session: Session, instance: Instance, after_id: int, limit: int = 1000
) -> list[GpuSamplePublic]:
    """The instance's samples stored after the one with id after_id, in storing order."""
    rows = session.scalars(
        select(GpuSample)
        .where(GpuSample.instance_id == instance.id, GpuSample.id > after_id)
        .order_by(GpuSample.id)
        .limit(limit)
    )
    return [sample_public(s) for s in rows]


def gpu_heatmap(session: Session, minutes: int = 60, bucket_s: int = 60) -> GpuHeatmap:
    """Mean utilisation per node × GPU × time bucket over the last `minutes`: what the admin
    page draws as a heat map. `buckets` are the buckets' starts (Unix s); a GPU's `util` has
    the mean % per bucket, None where no sample fell (a simulated GPU is None throughout)."""
    check_window(minutes)
    if not 5 <= bucket_s <= 86_400:
        raise InvalidInput("bucket_s must be from 5 to 86400 seconds")
    count = math.ceil(minutes * 60 / bucket_s)
    if count > MAX_HEATMAP_BUCKETS:
        raise InvalidInput(
            f"{minutes} minutes in {bucket_s} s buckets makes {count} columns; at most "
            f"{MAX_HEATMAP_BUCKETS}: choose a larger bucket_s"
        )
    end = utcnow()
    start = end - timedelta(seconds=count * bucket_s)
    t0 = start.timestamp()
    sums: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    node_rows = list(session.scalars(select(Node).order_by(Node.id)))
    rows = [
        row
        for node in node_rows  # one range scan of the (node_id, time) index per node
        for row in session.execute(
            select(GpuSample.gpu_uuid, GpuSample.time, GpuSample.util_pct).where(
                GpuSample.node_id == node.id, GpuSample.time >= start
            )
        )
    ]
    for uuid, time, reading in rows:
        b = min(int((time.timestamp() - t0) // bucket_s), count - 1)
        if b < 0 or reading is None:
            continue
        if uuid not in sums:
            sums[uuid], counts[uuid] = [0.0] * count, [0] * count
        sums[uuid][b] += reading
        counts[uuid][b] += 1
    nodes = []
    for node in node_rows:
        gpus = []
        for g in node.gpus:
            if not g.present:
                continue
            s, c = sums.get(g.uuid), counts.get(g.uuid)
            util: list[float | None] = (
                [None] * count
                if s is None or c is None or g.simulated
                else [s[i] / c[i] if c[i] else None for i in range(count)]
            )
            gpus.append(HeatmapGpu(**_gpu_public(g), instance_id=g.instance_id, util=util))
        nodes.append(HeatmapNode(id=node.id, name=node.name, gpus=gpus))
    return GpuHeatmap(
        start=t0,
        end=end.timestamp(),
        bucket_s=bucket_s,
        buckets=[t0 + i * bucket_s for i in range(count)],
        nodes=nodes,
    )
