"""The queue as the scheduling policy sees it: what the server hands `schedule()`, and each
queued instance's place, reason and estimated start, from the very decisions the scheduler
reconciler applies (reconcilers/scheduler.py).

Durations, which backfill and the estimates need, come from what the owner declared (the
instance's maximum runtime: `--max-duration 2h`, a task's `max_duration:`, `gpulease instance
autostop --max-runtime`) or else what the platform learned from the owner's earlier runs of
the same task (runs carry their task file's `name:`): the median of the newest few.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.orm import Session

from gpulease.core.durations import span
from gpulease.scheduler.fifo import Request
from gpulease.scheduler.model import ClusterState, Config, FairShare, Running, RunningSet
from gpulease.scheduler.model import Request as PolicyRequest
from gpulease.scheduler.placement import FreeMap
from gpulease.scheduler.policy import policy_order
from gpulease.server.db import batches, utcnow
from gpulease.server.orm import Gpu, Instance, Node, Run, UsageSegment
from gpulease.server.services import quotas
from gpulease.server.services.billing import plans
from gpulease.server.services.instances.states import QUEUED, STOPPING

# Priority classes, fair share, EASY backfill, quotas and spot preemption; the quotas are
# the admins' (services/quotas.py), read every tick (server_config).
SERVER_POLICY = Config(policy="default")
LEARNED_RUNS = 10  # the owner's newest finished runs of a task that a learned duration uses
NO_DURATION = "no duration known"


@dataclass(frozen=True)
class Duration:
    seconds: float
    basis: str  # in words: "declared 2 h", "learned from your last 5 runs of train"
    declared: bool


def server_config(session: Session) -> Config:
    """The server's policy with the admins' quotas of now."""
    caps = quotas.current(session)
    return replace(SERVER_POLICY, user_quota=caps.users, team_quota=caps.teams)


def declared_basis(max_runtime_minutes: int) -> str:
    """'declared 2 h': the words for a declared duration."""
    return f"declared {span(max_runtime_minutes * 60)}"


def duration_basis(instance: Instance) -> str | None:
    """Where the instance's expected duration comes from: a declared one as it is now, else
    what the scheduler last learned (written each tick while anything queues)."""
    if instance.max_runtime_minutes:
        return declared_basis(instance.max_runtime_minutes)
    stored = instance.duration_basis
    return None if not stored or stored.startswith("declared ") else stored


def durations(session: Session, instances: Iterable[Instance]) -> dict[int, Duration]:
    """How long each instance will hold its GPUs, where something says so: its declared
    maximum runtime, else the median of its owner's newest finished runs of the same task
    (the task of the instance's newest run)."""
    out: dict[int, Duration] = {}
    undeclared: list[Instance] = []
    for instance in instances:
        if instance.max_runtime_minutes:
            seconds = instance.max_runtime_minutes * 60.0
            out[instance.id] = Duration(seconds, declared_basis(instance.max_runtime_minutes), True)
        else:
            undeclared.append(instance)
    tasks = _tasks(session, [i.id for i in undeclared])
    wanted: dict[tuple[int, str], list[int]] = defaultdict(list)
    for instance in undeclared:
        if (task := tasks.get(instance.id)) is not None:
            wanted[(instance.owner_id, task)].append(instance.id)
    for (owner_id, task), ids in wanted.items():
        learned = _learned(session, owner_id, task)
        if learned is not None:
            for instance_id in ids:
                out[instance_id] = learned
    return out


def _tasks(session: Session, instance_ids: list[int]) -> dict[int, str]:
    """The task name of each instance's newest run that has one."""
    out: dict[int, str] = {}
    if not instance_ids:
        return out
    for batch in batches(sorted(instance_ids)):
        for instance_id, task in session.execute(
            select(Run.instance_id, Run.task_name)
            .where(Run.instance_id.in_(batch), Run.task_name.is_not(None))
            .order_by(Run.id)
        ):
            if task is not None:
                out[instance_id] = task  # the newest wins
    return out


def _learned(session: Session, owner_id: int, task: str) -> Duration | None:
    rows = session.execute(
        select(Run.started_at, Run.finished_at)
        .where(
            Run.owner_id == owner_id,
            Run.task_name == task,
            Run.status == "succeeded",
            Run.started_at.is_not(None),
            Run.finished_at.is_not(None),
        )
        .order_by(Run.finished_at.desc(), Run.id.desc())
        .limit(LEARNED_RUNS)
    ).all()
    seconds = [
        (finished - started).total_seconds()
        for started, finished in rows
        if started is not None and finished is not None
    ]
    if not seconds:
        return None
    median = statistics.median(seconds)
    runs = f"your last {len(seconds)} runs" if len(seconds) != 1 else "your last run"
    return Duration(median, f"learned from {runs} of {task} (median {span(int(median))})", False)


def cluster_state(
    session: Session, queue: list[Request], now: datetime, grace_s: float = 0.0
) -> tuple[ClusterState, dict[tuple[int, str], list[int]], dict[int, Duration]]:
    """What the policy sees: free GPUs on ready nodes, instances holding GPUs (a stopping
    one gives them back within `grace_s` of its stop), the queue with its durations, and
    each owner's recent GPU-seconds; plus the free GPU ids per (node, model), lowest index
    first, to hand out when a request starts there; and the durations known, by instance id."""
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
    holders = list(session.scalars(select(Instance).where(Instance.id.in_(list(held)))))
    rows = _queued_rows(session, queue)
    known = durations(session, [*holders, *rows.values()])
    running = RunningSet()
    for instance in holders:
        gpus = held[instance.id]
        per_node: dict[int, int] = defaultdict(int)
        for gpu in gpus:
            per_node[gpu.node_id] += 1
        start = (instance.started_at or instance.created_at).timestamp()
        stopping = instance.status == STOPPING
        end = _expected_end(instance, start, known.get(instance.id), now.timestamp())
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
    requests = _requests(queue, rows, known)
    node_ids = list(session.scalars(select(Node.id).where(Node.status == "ready")))
    state = ClusterState(free, running, requests, _usage(session, now), node_ids)
    return state, free_ids, known


def _expected_end(
    instance: Instance, start: float, known: Duration | None, now: float
) -> float | None:
    """When an instance will give its GPUs back, if anything says so: the end of a daily
    block that does not renew, its maximum runtime, or its learned duration (while that
    still lies ahead: one that overruns it has no known end)."""
    if instance.plan == plans.DAILY and instance.reserved_until and not instance.auto_renew:
        block = instance.reserved_until.timestamp()
        return block if known is None else min(block, start + known.seconds)
    if known is None:
        return None
    end = start + known.seconds
    return end if instance.max_runtime_minutes or end > now else None


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


def _requests(
    queue: list[Request], rows: dict[int, Instance], known: dict[int, Duration]
) -> list[PolicyRequest]:
    return [
        PolicyRequest(
            r.instance_id,
            str(row.owner_id),
            r.model,
            r.count,
            nodes=row.gang_size or 1,
            arrival=(row.queued_at or row.created_at).timestamp(),
            plan=row.plan,
            team=None if row.team_id is None else str(row.team_id),
            duration=d.seconds if (d := known.get(r.instance_id)) is not None else None,
            allowed=r.nodes,
            home=row.last_node_id,
        )
        for r in queue
        if (row := rows.get(r.instance_id)) is not None
    ]


def _queued_rows(
    session: Session, queue: Sequence[Request], *where: ColumnElement[bool]
) -> dict[int, Instance]:
    """The instances of the queue's requests by id, read a slice at a time: a queue can
    outgrow the parameters one statement may carry (65,535 on PostgreSQL)."""
    return {
        i.id: i
        for batch in batches(sorted(r.instance_id for r in queue))
        for i in session.scalars(select(Instance).where(Instance.id.in_(batch), *where))
    }


def queue_positions(session: Session, queue: list[Request]) -> dict[int, int]:
    """1-based place of each queued instance among those for its GPU model, in the order
    the scheduler takes them (the server's policy, fair share and all)."""
    if not queue:
        return {}
    now = utcnow()
    rows = _queued_rows(session, queue, Instance.status == QUEUED)
    requests = _requests(queue, rows, {})
    seen: dict[str, int] = defaultdict(int)
    out = {}
    for req in policy_order(requests, _usage(session, now), server_config(session)):
        seen[req.model] += 1
        out[req.id] = seen[req.model]
    return out
