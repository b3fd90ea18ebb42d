"""The scheduling policies: `schedule(state, now, config)` turns the cluster and its queue
into decisions (what starts where, what is preempted, why the rest waits and until when).

Pure: no DB, no clock, no I/O. The server calls it every tick; the simulator replays traces
through it. Policies, by name:

- `fifo`: arrival order; a blocked request holds up every later one for its GPU model.
- `backfill`: arrival order with EASY backfill: a later request may start ahead only if it
  does not delay the reserved start of the first blocked one.
- `default`: priority class (daily and on demand before spot, then the admin-set
  priority), then fair share (least recent GPU-seconds first), then arrival; EASY backfill,
  quotas, and preemption of spot instances (youngest first) for anything else.
- `las`: preemptive least attained service in discrete levels (every job is preemptible).
- `srtf`: preemptive shortest remaining time first, knowing every duration (an oracle).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpulease.scheduler.model import (
    PLAN_RANK,
    SPOT,
    ClusterState,
    Config,
    Decisions,
    Request,
    Running,
    RunningSet,
    Start,
    Waiting,
)
from gpulease.scheduler.placement import FreeMap

POLICIES = ("fifo", "backfill", "default", "las", "srtf")
INF = math.inf


@dataclass(slots=True)
class _End:
    """When GPUs come back: `count` of `model` on each of `node_ids`, at `at`; `start` is
    when the instance started (None: it is already stopping)."""

    at: float
    model: str
    node_ids: tuple[int, ...]
    count: int
    owner: str
    team: str | None
    start: float | None = None

    def __lt__(self, other: _End) -> bool:
        return self.at < other.at


@dataclass(slots=True)
class _Pass:
    """One greedy pass over the queue at one instant: what starts, and why the rest waits."""

    starts: list[tuple[Request, tuple[int, ...]]] = field(default_factory=list)
    why: dict[int, str] = field(default_factory=dict)


class _Ends:
    """Expected ends in time order: the running set's (kept sorted by its owner) merged
    with those of instances started during this tick."""

    def __init__(self, running: RunningSet) -> None:
        self.running = running
        self.extra: list[_End] = []

    def add(self, end: _End) -> None:
        bisect.insort(self.extra, end)

    def __iter__(self) -> Iterator[_End]:
        by_id = self.running.by_id

        def base() -> Iterator[_End]:
            for at, rid in self.running.ends:
                r = by_id[rid]
                start = None if r.stopping else r.start
                yield _End(at, r.model, r.node_ids, r.count, r.owner, r.team, start)

        return heapq.merge(base(), self.extra)


class _Timeline:
    """Expected ends in time order as a sorted list read from `head` on: the forward
    simulation takes them from the front, adds new ones in place, and a reservation reads
    them in order without sorting anything."""

    __slots__ = ("items", "head")

    def __init__(self, ends: Iterable[_End], now: float) -> None:
        # An instance past its expected end has run longer than its declared or learned
        # duration said: it is expected to run about as long again as it has so far (the
        # median rest of a heavy-tailed duration), not to end this instant.
        self.items: list[tuple[float, int, _End]] = []
        overdue = False
        for k, e in enumerate(ends):
            if e.at < now and e.start is not None and e.start < now:
                e = replace(e, at=now + (now - e.start))
                overdue = True
            self.items.append((e.at, k, e))
        if overdue:
            self.items.sort()
        self.head = 0

    def __bool__(self) -> bool:
        return self.head < len(self.items)

    def first(self) -> float:
        return self.items[self.head][0]

    def pop(self) -> _End:
        self.head += 1
        return self.items[self.head - 1][2]

    def push(self, at: float, seq: int, end: _End) -> None:
        bisect.insort(self.items, (at, seq, end), lo=self.head)

    def __iter__(self) -> Iterator[_End]:
        items = self.items
        return (items[k][2] for k in range(self.head, len(items)))


class _Within:
    """The nodes a backfilled request may take without delaying a reservation: those that
    will still have `count` GPUs spare at the reserved start (and that it may run on)."""

    __slots__ = ("spare", "count", "allowed")

    def __init__(self, spare: dict[int, int], count: int, allowed: frozenset[int] | None):
        self.spare, self.count, self.allowed = spare, count, allowed

    def __contains__(self, node_id: object) -> bool:
        return self.spare.get(node_id, 0) >= self.count and (  # type: ignore[call-overload]
            self.allowed is None or node_id in self.allowed
        )


def schedule(
    state: ClusterState,
    now: float,
    config: Config | None = None,
    explain: Collection[int] | None = None,
) -> Decisions:
    """Decide this tick. `explain` limits the reasons and ETAs to those request ids (None:
    every waiting request); a caller that only needs first estimates saves the work."""
    config = config or Config()
    if config.policy not in POLICIES:
        raise ValueError(f"unknown policy {config.policy!r}; choose one of {', '.join(POLICIES)}")
    free = state.free.copy()
    order = _order(state.queue, state.usage, config)
    ends = _Ends(state.running)
    held_user: dict[str, int] = defaultdict(int, state.running.held_user)
    held_team: dict[str, int] = defaultdict(int, state.running.held_team)
    decisions = Decisions()
    result = _greedy(
        free, ends, order, now, config, held_user, held_team, state.node_ids, explain is None
    )
    started = {req.id for req, _ in result.starts}
    if config.policy in ("default", "las", "srtf") and (
        config.spot_preemption or config.policy != "default"
    ):
        _preempt(state.running, free, order, started, now, config, result, decisions)
    decisions.starts = [Start(req.id, nodes) for req, nodes in result.starts]
    waiting = [req for req in order if req.id not in started]
    wanted = [r for r in waiting if explain is None or r.id in explain]
    if not wanted:
        return decisions
    for req, node_ids in result.starts:
        if req.duration is not None and req.count:
            ends.add(_End(now + req.duration, req.model, node_ids, req.count, req.owner, req.team))
    etas = _forward(free, ends, waiting, now, config, held_user, held_team, state.node_ids, wanted)
    positions: dict[str, int] = defaultdict(int)
    want_ids = None if explain is None else {r.id for r in wanted}
    why, out = result.why, decisions.waiting
    needs: dict[tuple[str, int, int], str] = {}  # the same words for the same shape
    for req in waiting:
        place = positions[req.model] = positions[req.model] + 1
        if want_ids is not None and req.id not in want_ids:
            continue
        reason = why.get(req.id)
        if not reason:
            shape = (req.model, req.count, req.nodes)
            reason = needs.get(shape) or needs.setdefault(shape, _needs(req, free))
        if place > 1:
            reason += f"; {place - 1} request{'s' if place != 2 else ''} ahead of you"
        out[req.id] = Waiting(req.id, place, reason, etas.get(req.id))
    return decisions


def policy_order(
    queue: Sequence[Request], usage: Mapping[str, float], config: Config
) -> list[Request]:
    """The queue in the order the policy takes it (`queue` in arrival order)."""
    if config.policy not in POLICIES:
        raise ValueError(f"unknown policy {config.policy!r}; choose one of {', '.join(POLICIES)}")
    return _order(queue, usage, config)


def _order(queue: Sequence[Request], usage: Mapping[str, float], config: Config) -> list[Request]:
    policy = config.policy
    if policy in ("fifo", "backfill"):
        return list(queue)  # the queue comes in arrival order
    if policy == "default":
        share = usage
        return sorted(
            queue,
            key=lambda r: (
                PLAN_RANK.get(r.plan, 1),
                -r.priority,
                share.get(r.owner, 0.0),
                r.arrival,
                r.id,
            ),
        )
    if policy == "las":
        th = config.las_thresholds
        return sorted(queue, key=lambda r: (bisect.bisect(th, r.attained), r.arrival, r.id))
    return sorted(queue, key=lambda r: (_remaining(r), r.arrival, r.id))


def _remaining(r: Request | Running, now: float = 0.0) -> float:
    if r.duration is None:
        return INF
    done = r.attained / max(1, r.gpus)
    if isinstance(r, Running):
        done += now - r.start
    return max(0.0, r.duration - done)


def _quota_refusal(
    req: Request, config: Config, held_user: dict[str, int], held_team: dict[str, int]
) -> str | None:
    cap = config.user_quota.get(req.owner, config.default_user_quota)
    if cap is not None and held_user[req.owner] + req.gpus > cap:
        return (
            f"over the per-user quota: {req.owner} holds {held_user[req.owner]} of at most "
            f"{cap} GPUs and this needs {req.gpus}; it starts when some of those stop"
        )
    if req.team is not None:
        cap = config.team_quota.get(req.team, config.default_team_quota)
        if cap is not None and held_team[req.team] + req.gpus > cap:
            return (
                f"over team {req.team}'s quota: it holds {held_team[req.team]} of at most "
                f"{cap} GPUs and this needs {req.gpus}"
            )
    return None


def _needs(req: Request, free: FreeMap) -> str:
    largest = free.largest(req.model)
    if req.nodes > 1:
        having = sum(1 for n in free.nodes(req.model).values() if n >= req.count)
        return (
            f"needs {req.nodes} nodes with {req.count} × {req.model} free each (all at once); "
            f"{having} node{'s' if having != 1 else ''} can take that now"
        )
    return f"needs {req.count} × {req.model} on one node; the largest free block is {largest}"


def _reserve(
    free: FreeMap, ends: Iterable[_End], req: Request, now: float
) -> tuple[float, dict[int, int]] | None:
    """The earliest time the running instances' expected ends leave room for `req`, and
    the GPUs of its model each node will still have spare then once `req` holds its own.
    None when no known end ever makes room.

    As FreeMap.fit would on the free GPUs plus those given back: the nodes that can take
    `req` are those with enough free now or made so by an end; they only ever grow, and the
    chosen ones are the tightest (lowest id among equals)."""
    model, count, allowed = req.model, req.count, req.allowed
    base = free.nodes(model)
    added: dict[int, int] = {}
    ok = {n for n in free.at_least(model, count) if allowed is None or n in allowed}
    pending: float | None = None
    changed = True  # whether `ok` may have grown since the last look
    for e in ends:
        if pending is not None and e.at != pending and changed:
            if len(ok) >= req.nodes:
                return _spare(base, added, ok, req, max(pending, now))
            changed = False
        pending = e.at
        if e.model == model:
            for n in e.node_ids:
                got = added[n] = added.get(n, 0) + e.count
                fits = n not in ok and base.get(n, 0) + got >= count
                if fits and (allowed is None or n in allowed):
                    ok.add(n)
                    changed = True
    if pending is not None and len(ok) >= req.nodes:
        return _spare(base, added, ok, req, max(pending, now))
    return None


def _spare(
    base: Mapping[int, int], added: dict[int, int], ok: set[int], req: Request, at: float
) -> tuple[float, dict[int, int]]:
    spare = dict(base)
    for n, got in added.items():
        spare[n] = spare.get(n, 0) + got
    for n in sorted(ok, key=lambda n: (spare[n], n))[: req.nodes]:
        spare[n] -= req.count
    return at, spare


def _greedy(
    free: FreeMap,
    ends: Iterable[_End],
    order: Iterable[Request],
    now: float,
    config: Config,
    held_user: dict[str, int],
    held_team: dict[str, int],
    node_ids: Sequence[int],
    explain_all: bool,
    budget: int | None = None,
) -> _Pass:
    """Start what fits, in order. fifo: a blocked request blocks its model. backfill and
    default: the first blocked request per model gets a reservation (EASY) that later
    starts must not delay. las, srtf: anything that fits starts (preemption is separate)."""
    policy = config.policy
    easy = policy in ("backfill", "default")
    out = _Pass()
    blocked: set[str] = set()
    heads: dict[str, Request] = {}  # the first blocked request per model (EASY)
    reserved: dict[str, tuple[float, dict[int, int]]] = {}
    # (model, count, nodes) that found no node within the reservation's spare GPUs since
    # the last start: the next request of that shape finds none either (a start clears it)
    hopeless: dict[tuple[str, int, int], str] = {}  # -> the reason, worded once
    models = set(free.models())
    for req in order:
        if budget is not None and len(out.starts) >= budget:
            break
        model = req.model
        if req.count == 0:  # CPU only: any allowed node, its home first
            allowed = [n for n in node_ids if req.allowed is None or n in req.allowed]
            if allowed:
                out.starts.append((req, (req.home if req.home in allowed else min(allowed),)))
            elif explain_all:
                out.why[req.id] = "needs a node that can run its template; none is ready"
            continue
        if model in blocked or (not explain_all and free.total(model) == 0):
            if not explain_all and all(m in blocked or not free.total(m) for m in models):
                break
            continue
        nodes = None
        if free.total(model) >= req.gpus and free.largest(model) >= req.count:
            refusal = _quota_refusal(req, config, held_user, held_team)
            if refusal is not None:
                out.why[req.id] = refusal
                continue
            nodes = free.fit(model, req.count, req.nodes, req.allowed, req.home)
        if nodes is None:
            if policy == "fifo":
                blocked.add(model)
            elif easy and model not in heads:
                heads[model] = req
            continue
        if model in heads:
            if model not in reserved:
                got = _reserve(free, ends, heads[model], now)
                if got is None:  # no known end makes room: hold the model as FIFO does
                    blocked.add(model)
                    out.why[req.id] = _behind_unknown(heads[model])
                    continue
                reserved[model] = got
            shadow, spare = reserved[model]
            end = now + req.duration if req.duration is not None else INF
            if end > shadow:
                shape = (model, req.count, req.nodes)
                if req.allowed is None and shape in hopeless:
                    nodes = None
                else:
                    within = _Within(spare, req.count, req.allowed)
                    nodes = free.fit(model, req.count, req.nodes, within, req.home)
                if nodes is None:
                    out.why[req.id] = hopeless.get(shape) or (
                        f"{req.count} × {model} are free, but taking them would delay the "
                        "reserved start of a request ahead of it"
                    )
                    if req.allowed is None:
                        hopeless[shape] = out.why[req.id]
                    continue
                for n in nodes:
                    spare[n] -= req.count
        free.take(model, nodes, req.count)
        hopeless.clear()
        held_user[req.owner] += req.gpus
        if req.team is not None:
            held_team[req.team] += req.gpus
        out.starts.append((req, nodes))
    return out


def _behind_unknown(head: Request) -> str:
    return (
        f"waits behind a request for {head.gpus} × {head.model} that cannot start yet, "
        "and the instances holding those GPUs have no expected end"
    )


def _preempt(
    running: RunningSet,
    free: FreeMap,
    order: Sequence[Request],
    started: set[int],
    now: float,
    config: Config,
    result: _Pass,
    decisions: Decisions,
    attempts: int = 8,
) -> None:
    """Make room for blocked requests by stopping lower-priority running instances: spot
    ones for anything else under `default` (youngest first; never on demand or daily);
    any instance of a lower class under `las` and `srtf`."""
    policy = config.policy
    key: Callable[[Running], float]
    if policy == "default":
        pool = [r for r in running if r.plan == SPOT]
        key = lambda r: -r.start  # noqa: E731 (youngest first)
    elif policy == "las":
        pool = list(running)
        key = lambda r: -(r.attained + r.gpus * (now - r.start))  # noqa: E731
    else:
        pool = list(running)
        key = lambda r: -_remaining(r, now)  # noqa: E731
    pool = [r for r in pool if not r.stopping]
    pool.sort(key=key)
    # GPUs already on their way back are counted first: a request they make room for
    # preempts nothing more (the server waits out a grace period before GPUs come back).
    pool = [*sorted((r for r in running if r.stopping), key=lambda r: r.start), *pool]
    if not pool:
        return
    gone: set[int] = set()
    tries: dict[str, int] = defaultdict(int)
    for req in order:
        if req.id in started or req.count == 0 or tries[req.model] >= attempts:
            continue
        if policy == "default" and req.plan == SPOT:
            continue
        if req.id in result.why and result.why[req.id].startswith("over "):
            continue  # a quota, not room, holds it back
        tries[req.model] += 1
        trial = free.copy()
        chosen: list[Running] = []
        nodes = None
        for r in pool:
            if r.id in gone or r.model != req.model:
                continue
            if not r.stopping and not _lower(r, req, now, config):
                continue
            trial.give(r.model, r.node_ids, r.count)
            chosen.append(r)
            nodes = trial.fit(req.model, req.count, req.nodes, req.allowed)
            if nodes is not None:
                break
        if nodes is None:
            continue
        used = set(nodes)
        victims = [r for r in chosen if used.intersection(r.node_ids)]
        for r in victims:
            gone.add(r.id)
            free.give(r.model, r.node_ids, r.count)
            if not r.stopping:
                decisions.preempt.append(r.id)
        decisions.reclaiming[req.id] = [r.id for r in victims]
        free.take(req.model, nodes, req.count)
        result.starts.append((req, nodes))
        started.add(req.id)
        result.why.pop(req.id, None)


def _lower(r: Running, req: Request, now: float, config: Config) -> bool:
    """Whether running `r` ranks strictly below queued `req` (so it may be preempted)."""
    if config.policy == "las":
        th = config.las_thresholds
        attained = r.attained + r.gpus * (now - r.start)
        return bisect.bisect(th, attained) > bisect.bisect(th, req.attained)
    if config.policy == "srtf":
        return _remaining(r, now) > _remaining(req)
    return True


def _forward(
    free: FreeMap,
    ends: Iterable[_End],
    waiting: list[Request],
    now: float,
    config: Config,
    held_user: dict[str, int],
    held_team: dict[str, int],
    node_ids: Sequence[int],
    wanted: Sequence[Request],
) -> dict[int, float]:
    """ETAs: replay the queue forward over the expected ends of what runs (no new
    arrivals, non-preemptive), with the same greedy pass at each end."""
    free = free.copy()
    held_user, held_team = defaultdict(int, held_user), defaultdict(int, held_team)
    timeline = _Timeline(ends, now)
    seq = len(timeline.items)
    todo = {r.id for r in wanted}
    etas: dict[int, float] = {}
    queue = list(waiting)
    gone: set[int] = set()  # started in the simulation; dropped from `queue` now and then
    lo = 0  # queue[:lo] has all started
    budget = config.eta_events
    while todo and timeline and len(queue) > len(gone) and budget > 0:
        while lo < len(queue) and queue[lo].id in gone:
            lo += 1
        at = timeline.first()
        while timeline and timeline.first() <= at:
            e = timeline.pop()
            free.give(e.model, e.node_ids, e.count)
            held_user[e.owner] -= e.count * len(e.node_ids)
            if e.team is not None:
                held_team[e.team] -= e.count * len(e.node_ids)
        step = _greedy(
            free,
            timeline,
            _alive(queue, gone, lo),
            max(at, now),
            config,
            held_user,
            held_team,
            node_ids,
            False,
            budget,
        )
        if not step.starts:
            continue
        budget -= len(step.starts)
        for req, nodes in step.starts:
            gone.add(req.id)
            etas[req.id] = max(at, now)
            todo.discard(req.id)
            if req.duration is not None and req.count:
                end = max(at, now) + req.duration
                seq += 1
                timeline.push(end, seq, _End(end, req.model, nodes, req.count, req.owner, req.team))
        if len(gone) >= max(64, len(queue) // 16):
            queue = [r for r in queue if r.id not in gone]
            gone, lo = set(), 0
    return etas


def _alive(queue: list[Request], gone: set[int], lo: int) -> Iterator[Request]:
    return (r for r in itertools.islice(queue, lo, None) if r.id not in gone)
