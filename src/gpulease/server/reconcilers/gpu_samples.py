"""Node-level GPU sampling: every few seconds, read this host's real GPUs and store samples.

Each sample goes with the instance holding the GPU then. A GPU whose runner sends its own
samples (it posted one since this sampler last wrote one) is skipped, so no GPU is counted
twice. Simulated GPUs and hosts without NVML store nothing: no numbers are invented.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select

from gpulease.core.records import from_attributes
from gpulease.gpus.discovery import Nvml
from gpulease.gpus.sampling import GpuReading, read_gpus
from gpulease.server.db import readers, transaction, utcnow
from gpulease.server.orm import GpuSample
from gpulease.server.runtime import Runtime
from gpulease.server.services import metrics
from gpulease.server.services.metrics.gpus import newest_sample_times, real_gpu_uuids

log = logging.getLogger("gpulease.reconcilers")
SAMPLE_INTERVAL_S = 5.0
PRUNE_INTERVAL_S = 600.0
PRUNE_BATCH = 50_000
Reader = Callable[[Nvml | None, Sequence[str]], list[GpuReading]]

# uuid -> time of the last sample this process's sampler wrote for it
_written: dict[str, datetime] = {}


def sample_gpus(rt: Runtime, reader: Reader = read_gpus, nvml: Nvml | None = None) -> int:
    """Sample once; returns how many samples were stored. reader/nvml are test seams. The
    look at the node's GPUs only reads (no SQLite write lock): most hosts have none."""
    with transaction(readers(rt.sessions)) as session:
        node_id, uuids = real_gpu_uuids(session, rt.node_name)
        if node_id is None or not uuids:
            return 0
        recent = newest_sample_times(
            session, node_id, uuids, utcnow() - timedelta(seconds=SAMPLE_INTERVAL_S * 3)
        )
    mine = [u for u in uuids if u not in recent or (u in _written and recent[u] <= _written[u])]
    if not mine:
        return 0
    readings = reader(nvml, mine)  # NVML, outside any transaction
    if not readings:
        return 0
    with transaction(rt.sessions) as session:
        stored = metrics.ingest_node_readings(
            session,
            node_id,
            [from_attributes(metrics.GpuReadingIn, r) for r in readings],
        )
    for r in readings:
        _written[r.uuid] = datetime.fromtimestamp(r.time, UTC)
    return stored


def prune_samples(rt: Runtime, now: datetime | None = None) -> int:
    """Delete GPU samples older than GPULEASE_GPU_SAMPLE_RETENTION_DAYS, at most PRUNE_BATCH
    a call (short transactions; the next call goes on). Returns how many went."""
    cutoff = (now or utcnow()) - timedelta(days=rt.settings.gpu_sample_retention_days)
    with transaction(rt.sessions) as session:
        old = (
            select(GpuSample.id)
            .where(GpuSample.time < cutoff)
            .order_by(GpuSample.id)
            .limit(PRUNE_BATCH)
        )
        result = session.execute(delete(GpuSample).where(GpuSample.id.in_(old)))
        return int(getattr(result, "rowcount", 0) or 0)
