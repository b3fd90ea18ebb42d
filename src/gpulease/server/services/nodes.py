"""Nodes and their GPUs: registration from discovery, free/total counts for the catalog."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gpulease.core.catalog import CPU_MODEL, Catalog
from gpulease.core.errors import InvalidInput, Unavailable
from gpulease.gpus.discovery import Inventory
from gpulease.server.db import utcnow
from gpulease.server.orm import Gpu, Node


def register_node(session: Session, name: str, backend: str, inventory: Inventory) -> Node:
    """Create or refresh a node and its GPU inventory. GPUs that vanished are marked absent
    (never deleted: an instance may still point at one)."""
    now = utcnow()
    node = session.scalar(select(Node).where(Node.name == name))
    if node is None:
        node = Node(name=name, backend=backend, registered_at=now, last_seen_at=now, hostname="")
        session.add(node)
    node.hostname = socket.gethostname()
    node.backend = backend
    node.driver_version = inventory.driver_version
    node.cuda_version = inventory.cuda_version
    node.cpu_count = os.cpu_count() or 1
    node.memory_mb = _memory_mb()
    node.last_seen_at = now
    node.status = "ready"
    session.flush()
    existing = {g.uuid: g for g in session.scalars(select(Gpu).where(Gpu.node_id == node.id))}
    seen = set()
    for found in inventory.gpus:
        seen.add(found.uuid)
        gpu = existing.get(found.uuid)
        if gpu is None:
            # a stale row may hold this index (the simulated set changed): free the slot
            stale = session.scalar(
                select(Gpu).where(Gpu.node_id == node.id, Gpu.index == found.index)
            )
            if stale is not None:
                stale.index = -stale.id
                stale.present = False
                session.flush()
            gpu = Gpu(node_id=node.id, uuid=found.uuid, index=found.index)
            session.add(gpu)
        gpu.index = found.index
        gpu.nvml_name = found.nvml_name
        gpu.model = found.model
        gpu.memory_mb = found.memory_mb
        gpu.simulated = found.simulated
        gpu.present = True
        session.flush()
    for uuid, gpu in existing.items():
        if uuid not in seen:
            gpu.present = False
            if gpu.index >= 0:
                gpu.index = -gpu.id
    session.flush()
    return node


def _memory_mb() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError):
        return 0


# A node's last-seen time is rewritten at most this often: often enough to read as real,
# seldom enough that a busy loop does not rewrite the row every tick.
SEEN_REFRESH = timedelta(seconds=30)


def mark_seen(
    session: Session, name: str, now: datetime, refresh: timedelta = SEEN_REFRESH
) -> bool:
    """Stamp a ready node as seen at `now` unless it was stamped within `refresh` (one
    guarded UPDATE, so replicas and ticks do not fight over the row). True when stamped."""
    result = session.execute(
        update(Node)
        .where(Node.name == name, Node.status == "ready", Node.last_seen_at < now - refresh)
        .values(last_seen_at=now)
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def list_nodes(session: Session) -> list[Node]:
    return list(session.scalars(select(Node).order_by(Node.id)))


@dataclass(frozen=True)
class ModelAvailability:
    model: str
    free: int
    total: int
    simulated: int
    largest_node: int  # most GPUs of this model on any one node


def availability(session: Session, catalog: Catalog) -> dict[str, ModelAvailability]:
    rows = session.execute(
        select(
            Gpu.model,
            Gpu.node_id,
            func.count(Gpu.id),
            func.count(Gpu.id).filter(Gpu.instance_id.is_(None)),
            func.count(Gpu.id).filter(Gpu.simulated.is_(True)),
        )
        .where(Gpu.present.is_(True), Gpu.model.is_not(None))
        .group_by(Gpu.model, Gpu.node_id)
    ).all()
    acc: dict[str, list[int]] = {}
    for model, _node_id, total, free, simulated in rows:
        a = acc.setdefault(str(model), [0, 0, 0, 0])
        a[0] += int(free)
        a[1] += int(total)
        a[2] += int(simulated)
        a[3] = max(a[3], int(total))
    node_count = session.scalar(select(func.count(Node.id))) or 0
    result = {}
    for m in catalog.models:
        if not m.is_gpu:
            result[m.name] = ModelAvailability(m.name, node_count, node_count, 0, 1)
            continue
        free, total, simulated, largest = acc.get(m.name, [0, 0, 0, 0])
        result[m.name] = ModelAvailability(m.name, free, total, simulated, largest)
    return result


def shares_per_gpu(session: Session, catalog: Catalog) -> dict[str, tuple[float, float]]:
    """Per model, the (vCPUs, RAM GB) that one of its GPUs comes with (a CPU-only
    instance's for CPU), as the launcher gives it (GpuModel.share_per_gpu) on the node
    that holds the most of that model's GPUs; models no node has are left out."""
    per_node = dict(
        session.execute(
            select(Gpu.node_id, func.count(Gpu.id))
            .where(Gpu.present.is_(True))
            .group_by(Gpu.node_id)
        ).all()
    )
    largest: dict[str, tuple[int, int]] = {}  # model -> (its GPUs on the node, node id)
    for model, node_id, count in session.execute(
        select(Gpu.model, Gpu.node_id, func.count(Gpu.id))
        .where(Gpu.present.is_(True), Gpu.model.is_not(None))
        .group_by(Gpu.model, Gpu.node_id)
    ).all():
        largest[str(model)] = max(largest.get(str(model), (0, 0)), (int(count), int(node_id)))
    node_rows = {n.id: n for n in session.scalars(select(Node))}
    result = {}
    for m in catalog.models:
        if m.is_gpu and m.name in largest:
            node = node_rows[largest[m.name][1]]
            gpus = int(per_node.get(node.id, 0))
        elif not m.is_gpu and node_rows:
            node, gpus = next(iter(node_rows.values())), 0
        else:
            continue
        result[m.name] = m.share_per_gpu(node.cpu_count, node.memory_mb, gpus)
    return result


def check_request_fits(session: Session, catalog: Catalog, model: str, count: int) -> str:
    """Refuse a request no node could ever hold; returns the catalog's spelling of model."""
    entry = catalog.get(model)
    avail = availability(session, catalog)[entry.name]
    if entry.name == CPU_MODEL or not entry.is_gpu:
        if count != 0:
            raise InvalidInput("CPU-only instances take no GPU count; leave --gpu out")
        if avail.total == 0:
            raise Unavailable("no node is registered yet; ask the operator to start a node")
        return entry.name
    offered = [name for name, a in availability(session, catalog).items() if a.total > 0]
    if avail.total == 0:
        raise Unavailable(
            f"no node offers {entry.name}; models on offer here: {', '.join(offered)}"
        )
    if count > avail.largest_node:
        raise Unavailable(
            f"{entry.name} × {count} does not fit on any node: the largest has "
            f"{avail.largest_node}; ask for {avail.largest_node} or fewer"
        )
    return entry.name
