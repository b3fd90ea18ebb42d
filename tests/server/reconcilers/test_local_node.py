"""The local node's last-seen time follows the reconciler loop, not the server's start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import update

from factories import Caller
from gpulease.server.db import transaction
from gpulease.server.orm import Node
from gpulease.server.reconcilers import local_node
from gpulease.server.runtime import Runtime
from gpulease.server.services import nodes

STARTED = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)  # as if the server started then


def _seen(admin: Caller) -> datetime:
    (node,) = admin.get("/api/v1/nodes").json()
    return datetime.fromisoformat(node["last_seen_at"])


def test_each_turn_of_the_loop_is_a_sighting_of_the_local_node(rt: Runtime, admin: Caller) -> None:
    with transaction(rt.sessions) as session:
        session.execute(update(Node).values(last_seen_at=STARTED))
    assert _seen(admin) == STARTED

    later = STARTED + timedelta(hours=2)
    local_node.tick(rt, now=later)
    assert _seen(admin) == later
    # within the refresh interval the row is left as it is; after it, stamped again
    local_node.tick(rt, now=later + nodes.SEEN_REFRESH / 2)
    assert _seen(admin) == later
    local_node.tick(rt, now=later + nodes.SEEN_REFRESH * 2)
    assert _seen(admin) == later + nodes.SEEN_REFRESH * 2


def test_a_node_that_is_not_ready_is_not_seen(rt: Runtime, admin: Caller) -> None:
    with transaction(rt.sessions) as session:
        session.execute(update(Node).values(last_seen_at=STARTED, status="gone"))
        assert not nodes.mark_seen(session, rt.node_name, STARTED + timedelta(hours=1))
    assert _seen(admin) == STARTED
