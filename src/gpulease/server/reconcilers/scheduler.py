"""Place queued instances on free GPUs with the scheduling policy (gpulease.scheduler).

Before the policy's pass: preempted spot instances that have stopped are queued again, a
daily-plan instance whose paid block still reserves its GPUs starts on them at once, and
instances that asked to start only when cheap wait outside the queue until an off-peak
window opens. A daily instance buys its block when it is placed. The spot instances the
policy preempts stop with notice and grace (services/preemption.py); the request they make
room for starts once they have given their GPUs back. Every request left waiting gets the
policy's reason and estimated start in its status message.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from gpulease.core.errors import PaymentRequired
from gpulease.scheduler.fifo import Placement, Request
from gpulease.scheduler.model import ClusterState, Config, FairShare, Running, RunningSet, Waiting
from gpulease.scheduler.model import Request as PolicyRequest
from gpulease.scheduler.placement import FreeMap
from gpulease.scheduler.policy import schedule
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Gpu, Instance, Node, UsageSegment
from gpulease.server.runtime import Runtime
from gpulease.server.services import ledger, notifications, preemption, quotas, templates
from gpulease.server.services.billing import offpeak, plans
from gpulease.server.services.instances.lifecycle import current_queue
from gpulease.server.services.instances.states import (
    QUEUED,
    STARTING,
    STOPPED,
    STOPPING,
    switch_status,
)

WAITING_FOR_CHEAP = "waiting for an off-peak window (start when cheap)"
# Priority classes, fair share, EASY backfill, quotas and spot preemption; the quotas are
# the admins' (services/quotas.py), read every tick (server_config).
SERVER_POLICY = Config(policy="default")


def tick(rt: Runtime) -> int:
    """One scheduling pass. Returns how many instances were placed."""
    placed = 0
    grace = rt.settings.preempt_grace_s
    with transaction(rt.sessions) as session:
        preemption.requeue_stopped(session)
        placed += _start_reserved(session)
        queue = _eligible(session, current_queue(session))
        # only nodes whose driver runs each instance's template (services/templates)
        queue, refused = templates.restrict_queue(session, queue)
        for instance_id, reason in refused.items():
            refused_instance = session.get(Instance, instance_id)
            if refused_instance is not None and refused_instance.status == QUEUED:
                _refuse(session, refused_instance, reason)
        if not queue:
            return placed
        now = utcnow()
        state, free_ids = cluster_state(session, queue, now, grace)
        decisions = schedule(state, now.timestamp(), server_config(session))
        for victim_id in decisions.preempt:
            victim = session.get(Instance, victim_id)
            if victim is not None:
                preemption.preempt(session, victim, now, grace)
        wanted = {r.instance_id: r for r in queue}
        for start in decisions.starts:
            req = wanted[start.request_id]
            ids = free_ids.get((start.node_ids[0], req.model), [])
            if start.request_id in decisions.reclaiming or len(ids) < req.count:
                _await_reclaim(session, start.request_id, decisions.reclaiming, grace)
                continue
            placement = Placement(req.instance_id, start.node_ids[0], tuple(ids[: req.count]))
            del ids[: req.count]
            instance = session.get(Instance, placement.instance_id)
            if instance is None or instance.status != QUEUED:
                continue
            if (
                instance.plan != plans.DAILY
                and ledger.balance(session, instance.owner_id, instance.team_id) <= 0
            ):
                _refuse(session, instance, "not started: the wallet's balance is zero")
                continue
            with session.begin_nested() as nested:
                taken = session.execute(
                    update(Gpu)
                    .where(Gpu.id.in_(placement.gpu_ids), Gpu.instance_id.is_(None))
                    .values(instance_id=instance.id)
                    .execution_options(synchronize_session=False)
                ).rowcount  # type: ignore[attr-defined]
                if taken != len(placement.gpu_ids):
                    nested.rollback()  # another replica took one of them; next tick
                    continue
                if instance.plan == plans.DAILY:
                    try:
                        plans.buy_block(session, instance, rt.catalog, utcnow())
                    except PaymentRequired as exc:
                        nested.rollback()
                        _refuse(session, instance, f"not started: {exc.message}")
                        continue
                instance.node_id = placement.node_id
                switch_status(session, instance, STARTING, "")
                placed += 1
        _explain(session, decisions.waiting, now)
    return placed


def server_config(session: Session) -> Config:
    """The server's policy with the admins' quotas of now."""
    caps = quotas.current(session)
    return replace(SERVER_POLICY, user_quota=caps.users, team_quota=caps.teams)


def cluster_state(
    session: Session, queue: list[Request], now: datetime, grace_s: float = 0.0
) -> tuple[ClusterState, dict[tuple[int, str], list[int]]]:
    """What the policy sees: free GPUs on ready nodes, instances holding GPUs (a stopping
    one gives them back within `grace_s` of its stop), the queue, and each owner's recent
    GPU-seconds; plus the free GPU ids per (node, model), lowest index first, to hand out
    when a request starts there."""
    free = FreeMap()
    free_ids: dict[tuple[int, str], list[int]] = defaultdict(list)
    for gpu in session.scalars(
        select(Gpu)
        .join(Node, Node.id == Gpu.node_id)
        .where(
            Gpu.instance_id.is_(None),
            Gpu.present.is_(True),
            Gpu.model.is_not(None),
            Node.status == "ready",
        )
        .order_by(Gpu.node_id, Gpu.index)
    ):
        model = gpu.model or ""
        free_ids[(gpu.node_id, model)].append(gpu.id)
    for (node_id, model), ids in free_ids.items():
        free.add_node(model, node_id, len(ids))
    held: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in session.scalars(select(Gpu).where(Gpu.instance_id.is_not(None))):
        assert gpu.instance_id is not None
        held[gpu.instance_id].append(gpu)
    running = RunningSet()
    for instance in session.scalars(select(Instance).where(Instance.id.in_(list(held)))):
        gpus = held[instance.id]
        per_node: dict[int, int] = defaultdict(int)
        for gpu in gpus:
            per_node[gpu.node_id] += 1
        start = (instance.started_at or instance.created_at).timestamp()
        stopping = instance.status == STOPPING
        end = _expected_end(instance, start)
        if stopping:
            asked = (instance.stop_requested_at or now).timestamp()
            end = asked + grace_s if end is None else min(end, asked + grace_s)
        running.add(
            Running(
                instance.id,
                str(instance.owner_id),
                gpus[0].model or instance.gpu_model,
                max(per_node.values()),
                tuple(sorted(per_node)),
                start,
                expected_end=end,
                plan=instance.plan,
                team=None if instance.team_id is None else str(instance.team_id),
                stopping=stopping,
            )
        )
    rows = {
        i.id: i
        for i in session.scalars(
            select(Instance).where(Instance.id.in_([r.instance_id for r in queue]))
        )
    }
    requests = [
        PolicyRequest(
            r.instance_id,
            str(rows[r.instance_id].owner_id),
            r.model,
            r.count,
            arrival=(rows[r.instance_id].queued_at or rows[r.instance_id].created_at).timestamp(),
            plan=rows[r.instance_id].plan,
            team=None if rows[r.instance_id].team_id is None else str(rows[r.instance_id].team_id),
            allowed=r.nodes,
        )
        for r in queue
        if r.instance_id in rows
    ]
    node_ids = list(session.scalars(select(Node.id).where(Node.status == "ready")))
    return ClusterState(free, running, requests, _usage(session, now), node_ids), free_ids


def _expected_end(instance: Instance, start: float) -> float | None:
    """When an instance will give its GPUs back, if anything says so: its maximum runtime,
    or the end of a daily block that does not renew."""
    if instance.max_runtime_minutes:
        return start + instance.max_runtime_minutes * 60
    if instance.plan == plans.DAILY and instance.reserved_until and not instance.auto_renew:
        return instance.reserved_until.timestamp()
    return None


def _usage(session: Session, now: datetime) -> dict[str, float]:
    """Each owner's GPU-seconds from usage segments, decayed with the policy's half-life."""
    share = FairShare(SERVER_POLICY.half_life)
    since = now - timedelta(seconds=4 * SERVER_POLICY.half_life)
    for seg in session.scalars(
        select(UsageSegment).where(
            or_(UsageSegment.ended_at.is_(None), UsageSegment.ended_at > since)
        )
    ):
        end = min(seg.ended_at or now, now)
        seconds = max(0.0, (end - seg.started_at).total_seconds())
        share.add(str(seg.owner_id), seg.gpu_count * seconds, end.timestamp())
    return share.usage(now.timestamp())


def _explain(session: Session, waiting: dict[int, Waiting], now: datetime) -> None:
    """Why each queued instance waits, and until about when, in its status message."""
    for instance_id, w in waiting.items():
        instance = session.get(Instance, instance_id)
        if instance is None or instance.status != QUEUED:
            continue
        if w.eta is None:
            when = "no start time can be estimated yet"
        else:
            minutes = max(0, round((w.eta - now.timestamp()) / 60))
            when = f"expected to start in about {minutes} min" if minutes else "starting soon"
        message = f"{w.reason}; {when}"[:500]
        if instance.status_message != message:
            instance.status_message = message


def _await_reclaim(
    session: Session, instance_id: int, reclaiming: dict[int, list[int]], grace_s: float
) -> None:
    """A request the policy starts on GPUs that instances still hold (preempted, or
    stopping): it stays queued, saying so, and starts on a later tick once they are back."""
    instance = session.get(Instance, instance_id)
    if instance is None or instance.status != QUEUED:
        return
    n = len(reclaiming.get(instance_id, ())) or 1
    message = (
        f"next to start: waiting for {n} instance{'s' if n != 1 else ''} to give back "
        f"their GPUs (a preempted spot instance gets {grace_s:.0f} s to checkpoint)"
    )
    if instance.status_message != message:
        instance.status_message = message


def _eligible(session: Session, queue: list[Request]) -> list[Request]:
    """The queue less instances waiting for an off-peak window (they do not hold it up)."""
    waiting = set(
        session.scalars(
            select(Instance.id).where(
                Instance.status == QUEUED, Instance.start_when_cheap.is_(True)
            )
        )
    )
    if not waiting:
        return queue
    cheap = offpeak.is_cheap_now(session)
    for instance_id in waiting:
        instance = session.get(Instance, instance_id)
        assert instance is not None
        instance.status_message = "" if cheap else WAITING_FOR_CHEAP
    return queue if cheap else [r for r in queue if r.instance_id not in waiting]


def _start_reserved(session: Session) -> int:
    """Queued daily instances whose block still reserves their GPUs: start them there."""
    now = utcnow()
    started = 0
    for instance in session.scalars(
        select(Instance).where(
            Instance.status == QUEUED,
            Instance.plan == plans.DAILY,
            Instance.reserved_until > now,
        )
    ).all():
        held = session.scalar(select(func.count(Gpu.id)).where(Gpu.instance_id == instance.id))
        if held == instance.gpu_count and (instance.node_id is not None or held == 0):
            switch_status(session, instance, STARTING, "")
            started += 1
    return started


def _refuse(session: Session, instance: Instance, reason: str) -> None:
    instance.desired_state = "stopped"
    switch_status(session, instance, STOPPED, reason)
    notifications.notify(session, instance.owner_id, "instance_stopped", reason)
