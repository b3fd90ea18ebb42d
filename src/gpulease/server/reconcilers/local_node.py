"""Keep the local node's last-seen time real: the server runs on that host, so each turn of
the reconciler loop is a sighting of it. (A fleet backend's nodes are seen by
reconcilers/fleet.py from the cluster's answer.) Registration alone stamped it only once,
at start-up, so `gpulease nodes` and the admin page showed the server's start time."""

from __future__ import annotations

from datetime import datetime

from gpulease.server.db import transaction, utcnow
from gpulease.server.runtime import Runtime
from gpulease.server.services import nodes


def tick(rt: Runtime, now: datetime | None = None) -> None:
    if rt.settings.backend != "local":
        return
    with transaction(rt.sessions) as session:
        nodes.mark_seen(session, rt.node_name, now or utcnow())
