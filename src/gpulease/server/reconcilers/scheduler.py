"""Place queued instances on free GPUs with the scheduling policy (gpulease.scheduler).

Before the policy's pass: preempted spot instances that have stopped are queued again, a
daily-plan instance whose paid block still reserves its GPUs starts on them at once, and
instances that asked to start only when cheap wait outside the queue until an off-peak
window opens. A daily instance buys its block when it is placed. The spot instances the
policy preempts stop with notice and grace (services/preemption.py); the request they make
room for starts once they have given their GPUs back. Every request left waiting gets the
policy's reason, its estimated start and what that estimate rests on, as fields of its own
and in its status message.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from gpulease.core.errors import Conflict, PaymentRequired
from gpulease.scheduler.fifo import Placement, Request
from gpulease.scheduler.model import ClusterState, Running, Waiting
from gpulease.scheduler.policy import schedule
from gpulease.server.db import finds_any, transaction, utcnow
from gpulease.server.orm import Gpu, Instance
from gpulease.server.runtime import Runtime
from gpulease.server.services import ledger, notifications, preemption, templates
from gpulease.server.services.billing import offpeak, plans
from gpulease.server.services.instances import gangs
from gpulease.server.services.instances.lifecycle import current_queue
from gpulease.server.services.instances.queue import (
    NO_DURATION,
    SERVER_POLICY,
    Duration,
    cluster_state,
    server_config,
)
from gpulease.server.services.instances.states import QUEUED, STARTING, STOPPED, switch_status

__all__ = ["SERVER_POLICY", "cluster_state", "server_config", "tick"]

WAITING_FOR_CHEAP = "waiting for an off-peak window (start when cheap)"


def tick(rt: Runtime) -> int:
    """One scheduling pass. Returns how many instances were placed. Asks first in a
    read-only transaction (no SQLite write lock) whether anything waits: every step below
    acts on queued instances, or on preempted ones that have stopped."""
    placed = 0
    grace = rt.settings.preempt_grace_s
    waiting = or_(
        Instance.status == QUEUED,
        and_(Instance.status == STOPPED, Instance.preempted_at.is_not(None)),
    )
    if not finds_any(rt.sessions, select(Instance.id).where(waiting)):
        return 0
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
        state, free_ids, known = cluster_state(session, queue, now, grace)
        decisions = schedule(state, now.timestamp(), server_config(session))
        for victim_id in decisions.preempt:
            victim = session.get(Instance, victim_id)
            if victim is not None:
                preemption.preempt(session, victim, now, grace)
        wanted = {r.instance_id: r for r in queue}
        fabric = gangs.fabric_range(rt.settings)
        for start in decisions.starts:
            req = wanted[start.request_id]
            if len(start.node_ids) > 1 and start.request_id not in decisions.reclaiming:
                placed += gangs.start_gang(
                    session, req.instance_id, start.node_ids, free_ids, fabric
                )
                continue
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
                try:
                    switch_status(session, instance, STARTING, "")
                except Conflict:
                    # its owner stopped or released it since the tick read it (another
                    # transaction, on PostgreSQL): nothing to start, the GPUs stay free
                    nested.rollback()
                    continue
                placed += 1
        _explain(session, decisions.waiting, now, state, known)
    return placed


def _explain(
    session: Session,
    waiting: Mapping[int, Waiting],
    now: datetime,
    state: ClusterState,
    known: dict[int, Duration],
) -> None:
    """Why each queued instance waits, until about when and what the estimate rests on: as
    fields of the instance and, together, in its status message."""
    models = {r.id: r.model for r in state.queue}
    holding: dict[str, list[Running]] = defaultdict(list)
    for r in state.running:
        holding[r.model].append(r)
        holder = session.get(Instance, r.id)  # loaded already, by cluster_state
        basis = known[r.id].basis if r.id in known else NO_DURATION
        if holder is not None and holder.duration_basis != basis:
            holder.duration_basis = basis
    ahead: dict[str, list[int]] = defaultdict(list)  # per model, in the policy's order
    for w in sorted(waiting.values(), key=lambda w: w.position):
        ahead[models.get(w.request_id, "")].append(w.request_id)
    for instance_id, w in waiting.items():
        instance = session.get(Instance, instance_id)
        if instance is None or instance.status != QUEUED:
            continue
        model = models.get(instance_id, "")
        before = ahead[model][: ahead[model].index(instance_id)]
        basis = eta_basis(model, holding[model], before, known)
        eta = None
        if w.eta is None:
            when = "no start time can be estimated yet"
        else:
            eta = datetime.fromtimestamp(w.eta, UTC)
            minutes = max(0, round((w.eta - now.timestamp()) / 60))
            when = f"expected to start in about {minutes} min" if minutes else "starting soon"
            if basis:
                when += f", from the {basis}"
        own = known.get(instance_id)
        _set_queue_fields(
            instance,
            reason=w.reason,
            eta=eta,
            basis=basis,
            duration=own.basis if own is not None else NO_DURATION,
            message=f"{w.reason}; {when}",
        )


def eta_basis(
    model: str, holding: list[Running], ahead: list[int], known: dict[int, Duration]
) -> str:
    """What an estimate rests on, in words that name nobody: 'expected ends of 3 of the 4
    instances holding A100-80GB (2 declared, 1 learned); durations of 1 of the 2 requests
    ahead (1 learned)'."""
    parts = []
    if holding:
        ends = [r for r in holding if r.expected_end is not None]
        parts.append(
            f"expected ends of {len(ends)} of the {len(holding)} instance"
            f"{'s' if len(holding) != 1 else ''} holding {model}"
            + _kinds([known.get(r.id) for r in ends], len(ends))
        )
    if ahead:
        durations = [known.get(i) for i in ahead]
        n = sum(1 for d in durations if d is not None)
        parts.append(
            f"durations of {n} of the {len(ahead)} request{'s' if len(ahead) != 1 else ''} "
            "ahead" + _kinds(durations, n)
        )
    return "; ".join(parts)


def _kinds(durations: list[Duration | None], total: int) -> str:
    declared = sum(1 for d in durations if d is not None and d.declared)
    learned = sum(1 for d in durations if d is not None and not d.declared)
    other = total - declared - learned  # a daily block's end, or a stop under way
    words = [
        f"{n} {what}"
        for n, what in ((declared, "declared"), (learned, "learned"), (other, "ending now"))
        if n
    ]
    return f" ({', '.join(words)})" if words else ""


def _set_queue_fields(
    instance: Instance,
    *,
    reason: str,
    eta: datetime | None = None,
    basis: str = "",
    duration: str | None = None,
    message: str | None = None,
) -> None:
    """Write the scheduler's word on a queued instance, touching only what changed."""
    values = {
        "queue_reason": reason[:500],
        "queue_eta": eta,
        "queue_eta_basis": basis[:500],
        "status_message": (reason if message is None else message)[:500],
    }
    if duration is not None:
        values["duration_basis"] = duration[:200]
    for key, value in values.items():
        if getattr(instance, key) != value:
            setattr(instance, key, value)


def _await_reclaim(
    session: Session, instance_id: int, reclaiming: dict[int, list[int]], grace_s: float
) -> None:
    """A request the policy starts on GPUs that instances still hold (preempted, or
    stopping): it stays queued, saying so, and starts on a later tick once they are back."""
    instance = session.get(Instance, instance_id)
    if instance is None or instance.status != QUEUED:
        return
    n = len(reclaiming.get(instance_id, ())) or 1
    reason = (
        f"next to start: waiting for {n} instance{'s' if n != 1 else ''} to give back "
        f"their GPUs (a preempted spot instance gets {grace_s:.0f} s to checkpoint)"
    )
    _set_queue_fields(instance, reason=reason)


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
        _set_queue_fields(instance, reason="" if cheap else WAITING_FOR_CHEAP)
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
