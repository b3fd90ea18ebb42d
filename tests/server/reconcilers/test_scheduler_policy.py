"""The scheduler reconciler applies exactly what schedule() decides for the state it reads,
and a waiting instance's status message carries the policy's reason and estimate."""

from __future__ import annotations

from collections.abc import Callable

from factories import Caller
from gpulease.scheduler.policy import schedule
from gpulease.server.db import transaction, utcnow
from gpulease.server.reconcilers import scheduler
from gpulease.server.runtime import Runtime
from gpulease.server.services import templates
from gpulease.server.services.instances.lifecycle import current_queue


def create(caller: Caller, gpu: str = "A100-80GB:1") -> int:
    r = caller.post("/api/v1/instances", json={"gpu": gpu})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_the_reconciler_applies_the_policys_decisions(
    ann: Caller, bob: Caller, rt: Runtime, tick: Callable[[], None]
) -> None:
    ids = [create(ann), create(bob, "A100-80GB:2"), create(ann), create(bob, "T4:1")]
    with transaction(rt.sessions) as session:
        queue, _ = templates.restrict_queue(session, current_queue(session))
        now = utcnow()
        state, _ = scheduler.cluster_state(session, queue, now)
        expected = schedule(state, now.timestamp(), scheduler.SERVER_POLICY)
    tick()
    started = {s.request_id for s in expected.starts}
    assert started and expected.waiting  # the fixture's cluster cannot take all four
    for i in ids:
        shown = (
            ann.get(f"/api/v1/instances/{i}")
            if i in (ids[0], ids[2])
            else bob.get(f"/api/v1/instances/{i}")
        )
        body = shown.json()
        if i in started:
            assert body["status"] == "starting", body
        else:
            assert body["status"] == "queued", body
            assert body["status_message"].startswith(expected.waiting[i].reason)
            assert "no start time can be estimated yet" in body["status_message"]
