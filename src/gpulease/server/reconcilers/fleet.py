"""Keep the node inventory in step with a fleet backend's cluster: nodes join, nodes leave.

A node that joins is registered with its GPUs (the catalog's free/total and `gpulease
nodes` show it at once); a node that leaves is marked gone, its GPUs are no longer offered
and its instances end with the reason "node NAME left the cluster", billed up to their
runner's last heartbeat; a spot one is queued again, as after a preemption. Runs before the
health check, from the same view of the cluster as the backend's alive(), so a dead node's
runners are put down to the node and not to a crash.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.backends.fleet import Fleet, FleetNode
from gpulease.core.errors import Unavailable
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Gpu, Instance, Node
from gpulease.server.runtime import Runtime
from gpulease.server.services import nodes, notifications
from gpulease.server.services.billing import plans
from gpulease.server.services.instances.states import (
    FAILED,
    LIVE,
    STOPPED,
    STOPPING,
    switch_status,
)

log = logging.getLogger("gpulease.fleet")

READY, GONE = "ready", "gone"
# A ready node's row is rewritten at least this often (last_seen_at), else only on change.
REFRESH = timedelta(seconds=30)


def tick(rt: Runtime) -> None:
    backend = rt.backend
    if not isinstance(backend, Fleet):
        return
    try:
        found = backend.nodes(rt.catalog)  # the cluster call, outside any transaction
    except Unavailable as exc:
        # No answer is no news: nothing is marked gone until the cluster says so.
        log.warning("node inventory not refreshed: %s", exc.message)
        return
    now = utcnow()
    with transaction(rt.sessions) as session:
        # every node: one left over from a run on another backend is not offered either
        known = {n.name: n for n in session.scalars(select(Node))}
        alive = {f.name: f for f in found if f.alive}
        for name, fleet_node in alive.items():
            node = known.get(name)
            if node is None or node.status != READY or _changed(session, node, fleet_node):
                log.info("node %s joined the cluster", name)
                _register(session, backend.name, fleet_node)
            elif now - node.last_seen_at > REFRESH:
                node.last_seen_at = now
        for name, node in known.items():
            if name not in alive and node.status != GONE:
                log.warning("node %s left the cluster", name)
                node_left(session, node)


def _register(session: Session, backend: str, fleet_node: FleetNode) -> None:
    node = nodes.register_node(session, fleet_node.name, backend, fleet_node.inventory)
    # register_node describes the server's host; a fleet node is described by the cluster
    node.hostname = fleet_node.hostname[:255]
    node.cpu_count = fleet_node.cpu_count
    node.memory_mb = fleet_node.memory_mb


def _changed(session: Session, node: Node, fleet_node: FleetNode) -> bool:
    """True when the node's GPUs or driver differ from what the inventory holds."""
    present = {
        (g.uuid, g.model)
        for g in session.scalars(select(Gpu).where(Gpu.node_id == node.id, Gpu.present))
    }
    wanted = {(g.uuid, g.model) for g in fleet_node.inventory.gpus}
    return present != wanted or node.driver_version != fleet_node.inventory.driver_version


def node_left(session: Session, node: Node) -> None:
    """Mark node gone, stop offering its GPUs, end its live instances with the reason."""
    node.status = GONE
    for gpu in session.scalars(select(Gpu).where(Gpu.node_id == node.id)):
        gpu.present = False
    reason = f"node {node.name} left the cluster"
    for instance in session.scalars(
        select(Instance).where(Instance.node_id == node.id, Instance.status.in_(LIVE))
    ).all():
        last_seen = instance.last_heartbeat_at or instance.runner_launched_at
        new = STOPPED if instance.status == STOPPING else FAILED
        if instance.plan == plans.SPOT and instance.desired_state == "running":
            # as if preempted now: stopped, then queued again with the runs unfinished now
            # (services/preemption.requeue_stopped), on a node that is still there
            instance.preempted_at = utcnow()
            new = STOPPED
        switch_status(session, instance, new, reason, at=last_seen)
        again = "; it is queued again" if instance.preempted_at is not None else ""
        notifications.notify(
            session,
            instance.owner_id,
            f"instance_{new}",
            f"instance {instance.name} {new}: {reason}{again}",
        )
