"""Sweeps: one task run once per point of a search space, each trial a `gpulease run` task on
its own instance, grouped under one record; the best trial by a metric, and the median
stopping rule applied to trials that fall behind (reconcilers/sweeps.py calls it).

A sweep is refused up front when its estimated total cost is above the wallet's balance.
Trials are ordinary instances: beyond the owner's GPU quota they wait in the queue.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core import sweeps as rules
from gpulease.core.catalog import Catalog
from gpulease.core.errors import InvalidInput, NotFound, PaymentRequired
from gpulease.core.money import cost_for_seconds, format_credits
from gpulease.core.taskspec import TaskSpec
from gpulease.schemas.instances import InstanceCreate
from gpulease.schemas.metrics import METRIC_KEY_PATTERN
from gpulease.schemas.runs import RunCreate
from gpulease.schemas.sweeps import SweepCreate, SweepPublic, SweepSpace, SweepTrialPublic
from gpulease.server.db import utcnow
from gpulease.server.orm import Instance, MetricPoint, Run, Sweep, SweepTrial, User
from gpulease.server.services import ledger, runs
from gpulease.server.services.instances import opening, queue
from gpulease.server.services.instances.states import ACTIVE, QUEUED, STOPPING, switch_status
from gpulease.server.services.metrics.points import SOURCES
from gpulease.server.settings import Settings

MAX_LISTED = 100


def space_of(body: SweepSpace) -> rules.Space:
    """The request's space, checked by the rules of core.sweeps; a seed picked when none
    was given, so that the record says how to draw the same trials again."""
    ranges = [
        rules.make_range(r.name, r.low, r.high, r.scale, f"range {r.name!r}") for r in body.ranges
    ]
    seed = body.seed if body.seed is not None else secrets.randbelow(2**31)
    return rules.make_space(body.grid, ranges, body.random, seed)


def space_record(space: rules.Space) -> dict[str, object]:
    return {
        "grid": {name: list(values) for name, values in space.grid},
        "ranges": [
            {"name": r.name, "low": r.low, "high": r.high, "scale": r.scale} for r in space.ranges
        ],
        "random": space.random,
        "seed": space.seed,
    }


def _check_metric(body: SweepCreate) -> None:
    if body.metric is not None and not METRIC_KEY_PATTERN.match(body.metric):
        raise InvalidInput(
            f"{body.metric!r} is not a metric key; a key starts with a letter or _, then up to "
            "63 letters, digits or _ . / - (for example 'val_acc' or 'val/acc')"
        )
    if body.stop_early and body.metric is None:
        raise InvalidInput(
            "stopping early compares trials by a metric: name it, e.g. --metric val_acc --max"
        )


def trial_run(body: SweepCreate, params: dict[str, str]) -> RunCreate:
    """The run of one trial: the task with its `${name}` placeholders filled in and the
    trial's values as upper-case environment variables (which win over the task's envs)."""
    task = body.task
    envs = {k: rules.substitute(v, params) for k, v in task.envs.items()}
    spec = TaskSpec(
        name=task.name,
        accelerators=task.gpu,
        envs={**envs, **rules.trial_env(params)},
        setup=rules.substitute(task.setup, params) if task.setup else None,
        run=rules.substitute(task.run, params),
        template=task.template,
        skypilot=task.skypilot,
    )
    return RunCreate.of_task(spec)


def _open_trial(
    session: Session,
    owner: User,
    sweep: Sweep,
    index: int,
    body: SweepCreate,
    *,
    catalog: Catalog,
    settings: Settings,
) -> Instance:
    task = body.task
    name = f"sweep-{sweep.id}-{index}"
    taken = session.scalar(
        select(Instance.id).where(Instance.owner_id == owner.id, Instance.name == name)
    )
    instance = opening.open_instance(
        session,
        owner,
        InstanceCreate(
            gpu=task.gpu,
            template=task.template,
            name=None if taken else name,
            auto_release=True,
            awaiting_workdir=task.awaiting_workdir,
            plan=task.plan,
            team=task.team,
            start_when_cheap=task.start_when_cheap,
            datasets=task.datasets,
            max_runtime_minutes=task.max_runtime_minutes,
        ),
        catalog=catalog,
        settings=settings,
    )
    instance.sweep_id = sweep.id
    return instance


@dataclass(frozen=True)
class Estimate:
    per_trial_micro: int
    total_micro: int
    basis: str


def estimate(session: Session, instance: Instance, trials: int, settings: Settings) -> Estimate:
    """What the sweep is expected to cost: each trial at its instance's rate for its
    declared maximum runtime, else what the owner's earlier runs of the task took, else the
    server's minimum start (what any start needs in the wallet)."""
    known = queue.durations(session, [instance]).get(instance.id)
    if known is not None:
        seconds, basis = int(known.seconds), known.basis
    else:
        seconds = settings.min_start_minutes * 60
        basis = f"the minimum start of {settings.min_start_minutes} min (no duration known)"
    per_trial = cost_for_seconds(instance.hourly_micro, seconds)
    return Estimate(per_trial, per_trial * trials, basis)


def create_sweep(
    session: Session, owner: User, body: SweepCreate, *, catalog: Catalog, settings: Settings
) -> Sweep:
    """The sweep, its trials' instances and their runs, all or nothing: a refusal (bad
    space, not enough credit, an instance that cannot be made) rolls every one back."""
    _check_metric(body)
    space = space_of(body.space)
    points = rules.expand(space)
    runs.task_name_of(body.name)
    sweep = Sweep(
        owner_id=owner.id,
        name=(body.name or body.task.name or "").strip() or None,
        space=space_record(space),
        metric=body.metric,
        goal=body.goal,
        stop_early=body.stop_early,
        min_steps=body.min_steps,
        min_trials=body.min_trials,
        created_at=utcnow(),
    )
    session.add(sweep)
    session.flush()
    symbol = catalog.currency_symbol
    for index, params in enumerate(points, start=1):
        instance = _open_trial(
            session, owner, sweep, index, body, catalog=catalog, settings=settings
        )
        run = trial_run(body, params)
        runs.create_run(
            session,
            instance,
            run.command,
            run.env,
            stop_instance_on_exit=True,
            task_name=run.task_name,
        )
        session.add(
            SweepTrial(sweep_id=sweep.id, index=index, params=params, instance_id=instance.id)
        )
        if index == 1:
            cost = estimate(session, instance, len(points), settings)
            balance = ledger.balance(session, owner.id, instance.team_id)
            if cost.total_micro > balance:
                raise PaymentRequired(
                    f"not enough credit for this sweep: {len(points)} trials of "
                    f"{instance.gpu_model}:{instance.gpu_count} at "
                    f"{format_credits(instance.hourly_micro, symbol)}/h are estimated at "
                    f"{format_credits(cost.total_micro, symbol)} "
                    f"({format_credits(cost.per_trial_micro, symbol)} each, from {cost.basis}); "
                    f"{'the team' if instance.team_id else 'your'} balance is "
                    f"{format_credits(balance, symbol)}. Sweep fewer trials, give each a "
                    "shorter maximum duration, or add credit."
                )
            sweep.estimated_micro = cost.total_micro
    session.flush()
    return sweep


def get_sweep(session: Session, owner: User, sweep_id: int) -> Sweep:
    sweep = session.get(Sweep, sweep_id)
    if sweep is None or sweep.owner_id != owner.id:
        raise NotFound(f"you have no sweep {sweep_id}; see `gpulease sweep ls`")
    return sweep


def list_sweeps(session: Session, owner: User, limit: int = MAX_LISTED) -> list[Sweep]:
    return list(
        session.scalars(
            select(Sweep).where(Sweep.owner_id == owner.id).order_by(Sweep.id.desc()).limit(limit)
        )
    )


# -- reading a sweep: its trials, their curves, the best one ---------------------------------


@dataclass(frozen=True)
class TrialState:
    trial: SweepTrial
    instance: Instance
    run: Run | None  # the instance's newest run


def trial_states(session: Session, sweep: Sweep) -> list[TrialState]:
    trials = list(
        session.scalars(
            select(SweepTrial).where(SweepTrial.sweep_id == sweep.id).order_by(SweepTrial.index)
        )
    )
    ids = [t.instance_id for t in trials]
    instances = {i.id: i for i in session.scalars(select(Instance).where(Instance.id.in_(ids)))}
    newest: dict[int, Run] = {}
    for run in session.scalars(select(Run).where(Run.instance_id.in_(ids)).order_by(Run.id)):
        newest[run.instance_id] = run
    return [TrialState(t, instances[t.instance_id], newest.get(t.instance_id)) for t in trials]


def curves(session: Session, states: list[TrialState], key: str) -> dict[int, rules.Curve]:
    """Each trial's points of `key` by step (over every run of its instance: a resumed run
    goes on where the first left off); one value per step, by the sources' preference."""
    by_instance = {s.instance.id: s.trial.index for s in states}
    rank: dict[str, int] = {source: i for i, source in enumerate(SOURCES)}
    points: dict[int, dict[int, tuple[int, float]]] = defaultdict(dict)
    rows = session.execute(
        select(Run.instance_id, MetricPoint.step, MetricPoint.value, MetricPoint.source)
        .join(Run, Run.id == MetricPoint.run_id)
        .where(Run.instance_id.in_(list(by_instance)), MetricPoint.key == key)
    )
    for instance_id, step, value, source in rows:
        index = by_instance[instance_id]
        preference = rank.get(source, len(rank))
        if step not in points[index] or preference < points[index][step][0]:
            points[index][step] = (preference, value)
    out = {}
    for index, by_step in points.items():
        steps = sorted(by_step)
        out[index] = rules.Curve(tuple(steps), tuple(by_step[s][1] for s in steps))
    return out


def metric_keys(session: Session, states: list[TrialState]) -> list[str]:
    ids = [s.instance.id for s in states]
    found = session.scalars(
        select(MetricPoint.key)
        .join(Run, Run.id == MetricPoint.run_id)
        .where(Run.instance_id.in_(ids))
        .distinct()
    )
    return sorted(found)


def _ended(state: TrialState) -> bool:
    if state.run is not None and runs.is_finished(state.run):
        return True
    return state.instance.status not in ACTIVE


def _state(state: TrialState) -> tuple[str, str]:
    """The trial's state key (for counts) and its status in words."""
    trial, instance, run = state.trial, state.instance, state.run
    if trial.stopped_early_at is not None:
        return "stopped_early", trial.stop_reason
    if run is not None and run.status == "succeeded":
        return "succeeded", "succeeded"
    if run is not None and run.status == "failed":
        return "failed", f"failed: {run.status_reason}" if run.status_reason else "failed"
    if instance.status not in ACTIVE:
        why = instance.status_reason or instance.status
        return "failed", f"failed: instance {instance.status} ({why})"
    if run is not None and run.status == "running":
        return "running", "running"
    if instance.status == QUEUED:
        note = instance.status_message
        return "queued", f"queued: {note}" if note else "queued"
    return "queued", instance.status


def view(
    session: Session, sweep: Sweep, catalog: Catalog, metric: str | None = None
) -> SweepPublic:
    """The sweep as the API shows it. `metric` (default: the sweep's) names the best trial;
    when the sweep has ended and no trial reported it, that is said in metric_note."""
    key = metric or sweep.metric
    if metric is not None and not METRIC_KEY_PATTERN.match(metric):
        raise InvalidInput(f"{metric!r} is not a metric key; e.g. metric=val_acc")
    states = trial_states(session, sweep)
    found = curves(session, states, key) if key else {}
    keys = metric_keys(session, states)
    finished = all(_ended(s) for s in states)
    if metric is not None and finished and metric not in keys:
        raise InvalidInput(_unseen(metric, keys))
    note = ""
    if key and not found:
        note = _unseen(key, keys) if finished else f"no trial has reported {key} yet"
    trials = []
    counts: dict[str, int] = defaultdict(int)
    for s in states:
        state, words = _state(s)
        counts[state] += 1
        curve = found.get(s.trial.index)
        trials.append(
            SweepTrialPublic(
                index=s.trial.index,
                params=s.trial.params,
                instance_id=s.instance.id,
                instance_name=s.instance.name,
                instance_status=s.instance.status,
                run_id=s.run.id if s.run else None,
                run_status=s.run.status if s.run else None,
                status=words,
                stopped_early=s.trial.stopped_early_at is not None,
                best=curve.best(sweep.goal) if curve else None,
                last_step=curve.steps[-1] if curve and curve.steps else None,
            )
        )
    return SweepPublic(
        id=sweep.id,
        name=sweep.name,
        space=sweep.space,
        metric=key,
        goal=sweep.goal,
        stop_early=sweep.stop_early,
        min_steps=sweep.min_steps,
        min_trials=sweep.min_trials,
        estimated_micro=sweep.estimated_micro,
        estimated=format_credits(sweep.estimated_micro, catalog.currency_symbol),
        created_at=sweep.created_at,
        finished=finished,
        counts=dict(counts),
        best_trial=rules.best_trial(found, sweep.goal),
        metric_note=note,
        keys=keys,
        trials=trials,
    )


def _unseen(key: str, keys: list[str]) -> str:
    seen = f"they reported {', '.join(keys)}" if keys else "they reported no metrics at all"
    return f"no trial of this sweep reported {key!r}; {seen}"


def trial_runs(session: Session, sweep: Sweep) -> list[tuple[SweepTrial, Run]]:
    """Each trial with its newest run, for the curves (a trial not run yet is left out)."""
    return [(s.trial, s.run) for s in trial_states(session, sweep) if s.run is not None]


# -- the median stopping rule ------------------------------------------------------------


def stop_behind(session: Session, sweep: Sweep, now: datetime) -> list[int]:
    """Stop (and release) each running trial that the median rule finds behind; the trial
    records why, and its instance's status reason says it. Returns their indices."""
    if not sweep.stop_early or not sweep.metric:
        return []
    states = trial_states(session, sweep)
    found = curves(session, states, sweep.metric)
    rule = rules.StopRule(sweep.min_steps, sweep.min_trials)
    stopped = []
    for s in states:
        curve = found.get(s.trial.index)
        if curve is None or s.trial.stopped_early_at is not None:
            continue
        if (
            s.instance.status not in ("starting", "running")
            or s.instance.desired_state != "running"
        ):
            continue
        others = [c for index, c in found.items() if index != s.trial.index]
        verdict = rules.median_stop(curve, others, sweep.goal, rule)
        if verdict is None:
            continue
        reason = verdict.reason(sweep.metric, sweep.goal)
        s.trial.stopped_early_at = now
        s.trial.stop_reason = reason
        s.instance.desired_state = "released"
        switch_status(session, s.instance, STOPPING, f"sweep {sweep.id}: {reason}"[:500])
        stopped.append(s.trial.index)
    return stopped


def live_sweep_ids(session: Session) -> list[int]:
    """Sweeps that stop early and still have a trial holding an active instance."""
    return list(
        session.scalars(
            select(Sweep.id)
            .join(SweepTrial, SweepTrial.sweep_id == Sweep.id)
            .join(Instance, Instance.id == SweepTrial.instance_id)
            .where(Sweep.stop_early.is_(True), Instance.status.in_(("starting", "running")))
            .distinct()
            .order_by(Sweep.id)
        )
    )
