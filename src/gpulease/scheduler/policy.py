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
import math
import operator
from collections import defaultdict, deque
from collections.abc import (
    Callable,
    Collection,
    Container,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, cast

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
    WaitingSet,
)
from gpulease.scheduler.placement import FreeMap

POLICIES = ("fifo", "backfill", "default", "las", "srtf")
INF = math.inf


# (when, node ids, what gives back `count` of its `model` on each of them then): a running
# instance, or a request started in this tick or in the forward simulation
_End = tuple[float, tuple[int, ...], "Running | Request"]
_AT = operator.itemgetter(0)


class _Pass:
    """One greedy pass over the queue at one instant: what starts, and why the rest waits;
    and, for a pass that explains every request (the tick's own: it reads them all),
    whether every request it read was for one GPU model, so that its answers can count
    places without telling models apart."""

    __slots__ = ("starts", "places", "why", "one_model")

    def __init__(self) -> None:
        self.starts: list[tuple[Request, tuple[int, ...]]] = []
        self.places: list[int] = []  # where each start stands in the order the pass read
        self.why: dict[int, str] = {}
        self.one_model = False


class _Timeline:
    """Expected ends in time order as a list of (at, node ids, holder) sorted on `at`, read
    from `head` on: the forward simulation takes them from the front and adds new ones in
    place; a reservation reads them in order without sorting anything. Nothing compares
    two entries beyond their time: ends at one instant are always taken together, so their
    order among themselves changes nothing."""

    __slots__ = ("items", "head", "ats")

    def __init__(self, items: list[_End], ats: list[float] | None = None) -> None:
        self.items = items
        self.head = 0
        self.ats = ats  # the times alone, where ends are added (floats bisect fastest)

    @classmethod
    def of(cls, running: RunningSet) -> _Timeline:
        """The running instances' expected ends as declared or learned (for decisions): the
        running set's own list, read and never changed (`ahead` copies it)."""
        return cls(cast(list[_End], running.ends))  # never added to (only `ahead`'s are)

    def ahead(self, starts: Iterable[tuple[Request, tuple[int, ...]]], now: float) -> _Timeline:
        """The timeline of the forward simulation: these ends, those of the requests that
        start now, and an instance past its expected end (it has run longer than its
        declared or learned duration said) expected to run about as long again as it has
        so far (the median rest of a heavy-tailed duration), not to end this instant."""
        items = list(self.items)
        for k in range(bisect.bisect_left(items, now, key=_AT)):  # the ends before now
            _, node_ids, r = items[k]
            if isinstance(r, Running) and not r.stopping and r.start < now:
                items[k] = (now + (now - r.start), node_ids, r)
        for req, node_ids in starts:
            if req.duration is not None and req.count:
                items.append((now + req.duration, node_ids, req))
        items.sort(key=_AT)
        return _Timeline(items, list(map(_AT, items)))

    def push(self, at: float, node_ids: tuple[int, ...], req: Request) -> None:
        """Add the end of a request started in the forward simulation (a timeline made by
        `ahead`), after those at the same time."""
        ats = self.ats
        assert ats is not None
        k = bisect.bisect_right(ats, at, self.head)
        ats.insert(k, at)
        self.items.insert(k, (at, node_ids, req))


class _Reservation:
    """A blocked request's reserved start (`at`) and the GPUs of its model each node will
    still have spare then, once it holds its own: `spare[n]` where that differs from the
    free GPUs now, else `free[n]` (the free map's live counts; a start records a node's
    spare count before it takes GPUs there, so an unrecorded node is as it was)."""

    __slots__ = ("at", "spare", "free")

    def __init__(self, at: float, spare: dict[int, int], free: Mapping[int, int]) -> None:
        self.at, self.spare, self.free = at, spare, free

    def left(self, node_id: int) -> int:
        spare = self.spare.get(node_id)
        return self.free.get(node_id, 0) if spare is None else spare

    def hold(self, node_ids: Iterable[int], count: int) -> None:
        """A start that ends after the reserved start takes `count` on each of `node_ids`."""
        for n in node_ids:
            self.spare[n] = self.left(n) - count

    def record(self, node_ids: Iterable[int]) -> None:
        """A start that ends before the reserved start is about to take GPUs on `node_ids`:
        keep their spare counts as they are."""
        for n in node_ids:
            if n not in self.spare:
                self.spare[n] = self.free.get(n, 0)


class _Within:
    """The nodes a backfilled request may take without delaying a reservation: those that
    will still have `count` GPUs spare at the reserved start (and that it may run on)."""

    __slots__ = ("reservation", "count", "allowed")

    def __init__(self, reservation: _Reservation, count: int, allowed: frozenset[int] | None):
        self.reservation, self.count, self.allowed = reservation, count, allowed

    def __contains__(self, node_id: object) -> bool:
        # FreeMap.fit asks only of nodes with `count` free: where the reservation has not
        # recorded a node, the node is as it is now and has them spare
        assert isinstance(node_id, int)
        spare = self.reservation.spare.get(node_id)
        return (spare is None or spare >= self.count) and (
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
    timeline = _Timeline.of(state.running)
    held_user: dict[str, int] = defaultdict(int, state.running.held_user)
    held_team: dict[str, int] = defaultdict(int, state.running.held_team)
    decisions = Decisions()
    result = _greedy(
        free, timeline, order, now, config, held_user, held_team, state.node_ids, explain is None
    )
    started = {req.id for req, _ in result.starts}
    if config.policy in ("default", "las", "srtf") and (
        config.spot_preemption or config.policy != "default"
    ):
        _preempt(state.running, free, order, started, now, config, result, decisions)
    decisions.starts = [Start(req.id, nodes) for req, nodes in result.starts]
    waiting = _without(order, result.places)
    wanted = waiting if explain is None else [r for r in waiting if r.id in explain]
    if not wanted:
        return decisions
    etas = _forward(
        free,
        timeline.ahead(result.starts, now),
        waiting,
        now,
        config,
        held_user,
        held_team,
        state.node_ids,
        None if explain is None else wanted,
    )
    decisions.waiting = _explain(
        waiting,
        None if explain is None else {r.id for r in wanted},
        result.why,
        etas,
        free,
        result.one_model,
    )
    return decisions


def _without(order: list[Request], places: list[int]) -> list[Request]:
    """`order` without the requests at `places` (distinct), copied a stretch at a time."""
    out: list[Request] = []
    last = 0
    for place in sorted(places):
        out += order[last:place]
        last = place + 1
    out += order[last:]
    return out


def _explain(
    waiting: list[Request],
    wanted: set[int] | None,
    why: dict[int, str],
    etas: dict[int, float],
    free: FreeMap,
    one_model: bool,
) -> WaitingSet:
    """Why each waiting request (of `wanted`; None: all) waits, with its place in its
    model's queue and its ETA. This is for every waiting request, so it does the least per
    request: no object of its own (the WaitingSet puts an answer together when one is
    read), and when the tick's pass read requests of one model only (`one_model`: it reads
    every request when all are wanted) and all are wanted, their places are simply 1, 2,
    3..."""
    shown: Sequence[Request] = waiting
    places: Sequence[int]
    if wanted is None and one_model:
        places = range(1, len(waiting) + 1)
    else:
        shown, places = [], []
        positions: dict[str, int] = defaultdict(int)
        for req in waiting:
            place = positions[req.model] = positions[req.model] + 1
            if wanted is None or req.id in wanted:
                shown.append(req)
                places.append(place)
    return WaitingSet(shown, places, why, etas, free)


_BY_MODEL = operator.attrgetter("model")


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
    if policy == "srtf":
        # (remaining, arrival, id) in three stable sorts: the tie-breaks first, on C keys,
        # then the remaining time alone, so that the sort compares floats, not tuples
        shortest = sorted(queue, key=_BY_ID)
        shortest.sort(key=_BY_ARRIVAL)
        shortest.sort(key=_remaining)
        return shortest
    # default and las: a few classes, each in (arrival, id) order. Sorting on the whole key
    # would compare the many requests of one class on all of it; instead the queue is dealt
    # into its classes in (arrival, id) order, which are then taken in order. The queue
    # comes in arrival order, so it is dealt as it comes while that holds; only a queue
    # found out of that order is first put in it (two sorts on a C key) and dealt again.
    classes = _classes(queue, usage, config)
    if classes is None:
        by_arrival = sorted(queue, key=_BY_ID)
        by_arrival.sort(key=_BY_ARRIVAL)
        classes = _classes(by_arrival, usage, config)
        assert classes is not None
    if len(classes) == 1:
        return list(next(iter(classes.values())))
    out: list[Request] = []
    for key in sorted(classes):
        out += classes[key]
    return out


def _classes(
    requests: Iterable[Request], usage: Mapping[str, float], config: Config
) -> dict[Any, list[Request]] | None:
    """`requests` dealt into the classes of `default` (plan rank, -priority, fair share) or
    `las` (its level), each class in the order they come; None as soon as they are found
    out of (arrival, id) order (the dealing then means nothing)."""
    classes: dict[Any, list[Request]] = {}
    last: Request | None = None
    last_arrival = -INF
    default = config.policy == "default"
    # default: a class is (plan rank, -priority, fair share): one per plan, priority and
    # owner, found once for each; las: the level of the service it attained
    rank, share, th = PLAN_RANK.get, usage.get, config.las_thresholds
    of: dict[tuple[str, int, str], list[Request]] = {}
    for r in requests:
        arrival = r.arrival
        if not arrival > last_arrival and (
            arrival != last_arrival or last is None or r.id < last.id
        ):
            return None
        last, last_arrival = r, arrival
        if default:
            members = of.get((r.plan, r.priority, r.owner))
            if members is None:
                key = (rank(r.plan, 1), -r.priority, share(r.owner, 0.0))
                members = of[r.plan, r.priority, r.owner] = classes.setdefault(key, [])
            members.append(r)
        else:
            classes.setdefault(bisect.bisect(th, r.attained), []).append(r)
    return classes


_BY_ID = operator.attrgetter("id")
_BY_ARRIVAL = operator.attrgetter("arrival")


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


def _reserve(free: FreeMap, timeline: _Timeline, req: Request, now: float) -> _Reservation | None:
    """The earliest time the running instances' expected ends leave room for `req`, and
    the GPUs of its model each node will still have spare then once `req` holds its own.
    None when no known end ever makes room.

    As FreeMap.fit would on the free GPUs plus those given back: the nodes that can take
    `req` are those with enough free now or made so by an end; they only ever grow, and the
    chosen ones are the tightest (lowest id among equals)."""
    model, count, allowed = req.model, req.count, req.allowed
    base = free.nodes(model)
    spare: dict[int, int] = {}  # free now plus given back so far, where something comes back
    ok = free.nodes_with(model, count)
    if allowed is not None:
        ok &= allowed
    pending: float | None = None
    changed = True  # whether `ok` may have grown since the last look
    items = timeline.items
    for i in range(timeline.head, len(items)):
        at, node_ids, e = items[i]
        if at != pending:
            if changed and pending is not None:
                if len(ok) >= req.nodes:
                    return _reservation(spare, base, ok, req, max(pending, now))
                changed = False
            pending = at
        if e.model == model:
            back = e.count
            for n in node_ids:
                got = spare.get(n)
                got = spare[n] = (base.get(n, 0) if got is None else got) + back
                if got >= count and n not in ok and (allowed is None or n in allowed):
                    ok.add(n)
                    changed = True
    if pending is not None and len(ok) >= req.nodes:
        return _reservation(spare, base, ok, req, max(pending, now))
    return None


def _reservation(
    spare: dict[int, int], base: Mapping[int, int], ok: set[int], req: Request, at: float
) -> _Reservation:
    reservation = _Reservation(at, spare, base)
    left = reservation.left
    if req.nodes == 1:
        n = next(iter(ok)) if len(ok) == 1 else min(ok, key=lambda n: (left(n), n))
        spare[n] = left(n) - req.count
    else:
        for n in heapq.nsmallest(req.nodes, ok, key=lambda n: (left(n), n)):
            spare[n] = left(n) - req.count
    return reservation


def _greedy(
    free: FreeMap,
    timeline: _Timeline,
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
    fifo, easy = policy == "fifo", policy in ("backfill", "default")
    out = _Pass()
    if budget is not None and budget <= 0:
        return out
    starts, why = out.starts, out.why
    blocked: set[str] = set()
    heads: dict[str, Request] = {}  # the first blocked request per model (EASY)
    reserved: dict[str, _Reservation] = {}
    # (model, count, nodes) that found no node within the reservation's spare GPUs since
    # the last start: the next request of that shape finds none either (a start clears it)
    hopeless: dict[tuple[str, int, int], str] = {}  # -> the reason, worded once
    models = free.models()  # a pass only takes GPUs of models the map has: they stay
    total, largest, fit = free.total, free.largest, free.fit
    quotas = _has_quotas(config)
    gpus_left = True  # (when not explaining) whether a GPU request may still start
    biggest: dict[str, int] = {}  # the largest free block per model, since the last take
    first_model: str | None = None
    one_model = explain_all  # (only a pass that explains all reads all, and notes it)
    places = out.places
    # a forward pass may leave unread the part of a class that could not start
    pass_over = order.pass_over if isinstance(order, _Reads) else None
    for place, req in enumerate(order):
        model, count = req.model, req.count
        if one_model and model != first_model:
            if first_model is None:
                first_model = model
            else:
                one_model = False
        if not count:  # CPU only: any allowed node, its home first
            allowed = [n for n in node_ids if req.allowed is None or n in req.allowed]
            if allowed:
                starts.append((req, (req.home if req.home in allowed else min(allowed),)))
                places.append(place)
                if budget is not None and len(starts) >= budget:
                    break
            elif explain_all:
                why[req.id] = "needs a node that can run its template; none is ready"
            continue
        if not gpus_left:
            continue
        if model in blocked:
            if not explain_all and all(m in blocked or not total(m) for m in models):
                if budget is not None:  # the forward pass: its CPU-only requests never fit
                    break
                gpus_left = False  # nothing more can start but CPU-only requests
            continue
        if hopeless and req.allowed is None:
            # A request of this shape found no room within the reservation since the last
            # start, and the free map is as it was then: this one finds none either unless
            # it ends before the reservation (as the checks below would find, at a cost
            # that counts when a pass reads thousands of such requests).
            said = hopeless.get((model, count, req.nodes))
            if said is not None and (
                req.duration is None or now + req.duration > reserved[model].at
            ):
                if quotas:
                    said = _quota_refusal(req, config, held_user, held_team) or said
                why[req.id] = said
                if pass_over is not None:
                    pass_over(hopeless, model, count, now, reserved[model].at)
                continue
        big = biggest.get(model)
        if big is None:
            big = biggest[model] = largest(model)
        if big < count and (big or explain_all):  # some GPUs free, but no block that big
            if fifo:
                blocked.add(model)
            elif easy and model not in heads:
                heads[model] = req
            continue
        free_now = total(model)
        if not free_now and not explain_all:
            if all(m in blocked or not total(m) for m in models):
                if budget is not None:
                    break
                gpus_left = False
            continue
        nodes = None
        gpus = count * req.nodes
        if free_now >= gpus and largest(model) >= count:
            if quotas:
                refusal = _quota_refusal(req, config, held_user, held_team)
                if refusal is not None:
                    why[req.id] = refusal
                    continue
            nodes = fit(model, count, req.nodes, req.allowed, req.home)
        if nodes is None:
            if fifo:
                blocked.add(model)
            elif easy and model not in heads:
                heads[model] = req
            continue
        reservation = None
        if model in heads:
            reservation = reserved.get(model)
            if reservation is None:
                reservation = _reserve(free, timeline, heads[model], now)
                if reservation is None:  # no known end makes room: hold the model as FIFO
                    blocked.add(model)
                    why[req.id] = _behind_unknown(heads[model])
                    continue
                reserved[model] = reservation
            end = now + req.duration if req.duration is not None else INF
            if end > reservation.at:
                shape = (model, count, req.nodes)
                if req.allowed is None and shape in hopeless:
                    nodes = None
                else:
                    within = _Within(reservation, count, req.allowed)
                    nodes = fit(model, count, req.nodes, within, req.home)
                if nodes is None:
                    why[req.id] = hopeless.get(shape) or (
                        f"{count} × {model} are free, but taking them would delay the "
                        "reserved start of a request ahead of it"
                    )
                    if req.allowed is None:
                        hopeless[shape] = why[req.id]
                    continue
                reservation.hold(nodes, count)
            else:
                reservation.record(nodes)
        free.take(model, nodes, count)
        del biggest[model]
        if hopeless:
            hopeless.clear()
        held_user[req.owner] += gpus
        if req.team is not None:
            held_team[req.team] += gpus
        starts.append((req, nodes))
        places.append(place)
        if budget is not None and len(starts) >= budget:
            break
    out.one_model = one_model
    return out


def _has_quotas(config: Config) -> bool:
    return bool(
        config.user_quota
        or config.team_quota
        or config.default_user_quota is not None
        or config.default_team_quota is not None
    )


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
    for place, req in enumerate(order):
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
        result.places.append(place)
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
    timeline: _Timeline,
    waiting: list[Request],
    now: float,
    config: Config,
    held_user: dict[str, int],
    held_team: dict[str, int],
    node_ids: Sequence[int],
    wanted: Sequence[Request] | None,
) -> dict[int, float]:
    """ETAs of `wanted` (None: every waiting request): replay the queue forward over the
    expected ends of what runs (no new arrivals, non-preemptive), with the same greedy
    pass at each end."""
    free = free.copy()
    held_user, held_team = defaultdict(int, held_user), defaultdict(int, held_team)
    todo = None if wanted is None else {r.id for r in wanted}
    etas: dict[int, float] = {}
    rest = _Rest(waiting)
    budget = config.eta_events
    # With every request wanted, some is still to start exactly while one is left.
    items = timeline.items  # read from timeline.head on (pushes insert in place)
    while (todo is None or todo) and timeline.head < len(items) and budget > 0 and rest.any_left():
        head = timeline.head
        at = items[head][0]
        while head < len(items) and items[head][0] <= at:  # every end at this instant
            _, node_ids, e = items[head]
            head += 1
            gpus = e.count * len(node_ids)
            free.give(e.model, node_ids, e.count)
            held_user[e.owner] -= gpus
            if e.team is not None:
                held_team[e.team] -= gpus
        timeline.head = head
        when = max(at, now)
        step = _greedy(
            free,
            timeline,
            rest.order(free),
            when,
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
            rest.started(req)
            etas[req.id] = when
            if todo is not None:
                todo.discard(req.id)
            if req.duration is not None and req.count:
                timeline.push(when + req.duration, nodes, req)
    return etas


class _Rest:
    """The waiting requests the forward simulation has not started yet, by GPU model and
    count per node, each class as its places in `waiting` (the policy's order), first
    first.

    A pass reads them in order, but of a model's requests too big for its largest free
    block it reads only the first: the others change nothing in a pass (a pass only takes
    GPUs, so they stay too big; the first is the one that holds the model, as FIFO, or
    takes the reservation, as EASY). At scale most of the queue is such requests, waiting
    for a whole node. CPU-only requests are left out: any that can start, starts in the
    tick's own pass.

    The classes are dealt as far as a pass reads, not beyond: the forward simulation's
    starts run out (its budget) long before the queue does, so most of a long queue is
    never dealt. Places from `dealt` on are not dealt yet; a pass reads the dealt ones
    first (all before them) and then deals on as it reads."""

    __slots__ = ("waiting", "classes", "dealt", "left", "shortest")

    def __init__(self, waiting: list[Request]) -> None:
        self.waiting = waiting
        self.classes: dict[str, dict[int, deque[int]]] = {}
        self.dealt = 0  # waiting[:dealt] are in the classes (or CPU-only)
        self.left = 0  # dealt requests not started yet
        # per class (model, count): at most the shortest duration of its requests (None: no
        # end, INF), kept by `ending_by`
        self.shortest: dict[tuple[str, int], float] = {}

    def any_left(self) -> bool:
        """Whether a GPU request is still to start (dealing on to the first one if need be)."""
        if self.left:
            return True
        waiting = self.waiting
        for k in range(self.dealt, len(waiting)):
            if waiting[k].count:
                self.dealt = k
                return True
        self.dealt = len(waiting)
        return False

    def order(self, free: FreeMap) -> _Reads:
        """The requests a pass on `free` reads, in order."""
        lists: list[Iterable[int]] = []
        keys: list[tuple[str, int] | None] = []  # each list's class (None: one request)
        bigs: dict[str, int] = {}  # the largest free block per model at the pass's start
        too_big: set[str] = set()  # models whose first too-big request the pass reads
        for model, by_count in self.classes.items():
            big = bigs[model] = free.largest(model)
            first_too_big = None
            for count, places in by_count.items():
                if not places:
                    continue
                if count <= big:
                    lists.append(places)
                    keys.append((model, count))
                elif first_too_big is None or places[0] < first_too_big:
                    first_too_big = places[0]
            if first_too_big is not None:
                lists.append((first_too_big,))
                keys.append(None)
                too_big.add(model)
        # every dealt place comes before those still to deal
        passed: dict[tuple[str, int], tuple[float, float]] = {}  # see _Reads.pass_over
        tail = None
        if self.dealt < len(self.waiting):
            tail = self._deal(free, bigs, too_big, passed)
        return _Reads(self, lists, keys, tail, passed)

    def ending_by(self, key: tuple[str, int], now: float, at: float, after: int) -> list[int]:
        """The places after `after` of the dealt requests of class `key` that, started
        `now`, would end by `at`, in order (none where the bound kept on the class's
        shortest duration tells so at once; else the bound is made exact)."""
        if now + self.shortest.get(key, INF) > at:
            return []
        waiting, shortest, found = self.waiting, INF, []
        for place in self.classes[key[0]][key[1]]:
            duration = waiting[place].duration
            if duration is not None:
                if duration < shortest:
                    shortest = duration
                if place > after and not now + duration > at:
                    found.append(place)
        self.shortest[key] = shortest
        return found

    def _deal(
        self,
        free: FreeMap,
        bigs: dict[str, int],
        too_big: set[str],
        passed: Mapping[tuple[str, int], tuple[float, float]],
    ) -> Iterator[Request]:
        """Deal the requests not dealt yet, in order, yielding those the pass reads (as
        `order` chooses them on the dealt ones, and as `_Reads.pass_over` cuts them down:
        `passed` holds the (now, at) of each class it cut)."""
        waiting, classes, shortest = self.waiting, self.classes, self.shortest
        for k in range(self.dealt, len(waiting)):
            req = waiting[k]
            count = req.count
            self.dealt = k + 1
            if not count:
                continue
            model = req.model
            by_count = classes.get(model)
            if by_count is None:
                by_count = classes[model] = {}
            places = by_count.get(count)
            if places is None:
                places = by_count[count] = deque()
            places.append(k)
            self.left += 1
            duration = INF if req.duration is None else req.duration
            if duration < shortest.get((model, count), INF):
                shortest[model, count] = duration
            big = bigs.get(model)
            if big is None:
                big = bigs[model] = free.largest(model)
            if count <= big:
                cut = passed.get((model, count)) if passed else None
                if cut is None or (req.duration is not None and not cut[0] + req.duration > cut[1]):
                    yield req
            elif model not in too_big:
                too_big.add(model)
                yield req

    def started(self, req: Request) -> None:
        places, waiting = self.classes[req.model][req.count], self.waiting
        for k, place in enumerate(places):  # among those the pass read, at the front
            if waiting[place] is req:
                del places[k]
                self.left -= 1
                return


class _Reads:
    """The requests a forward pass reads (`_Rest.order`): the dealt classes' places merged
    in order, then the requests still to deal (`tail`) as they are dealt; the pass may
    leave part of a class unread (`pass_over`)."""

    __slots__ = ("rest", "iters", "keys", "heap", "last", "place", "tail", "passed")

    def __init__(
        self,
        rest: _Rest,
        lists: list[Iterable[int]],
        keys: list[tuple[str, int] | None],
        tail: Iterator[Request] | None,
        passed: dict[tuple[str, int], tuple[float, float]],
    ) -> None:
        self.rest, self.keys, self.tail, self.passed = rest, keys, tail, passed
        self.iters = [iter(places) for places in lists]
        self.heap: list[tuple[int, int]] = []  # (next place, list) of each list but `last`
        for j, places in enumerate(self.iters):
            first = next(places, None)
            if first is not None:
                self.heap.append((first, j))
        heapq.heapify(self.heap)
        self.last = -1  # the list that the request last read came from (-1: none, or the tail)
        self.place = -1  # the place of the request last read from a list

    def __iter__(self) -> _Reads:
        return self

    def __next__(self) -> Request:
        heap, j = self.heap, self.last
        place = None if j < 0 else next(self.iters[j], None)
        if place is None:
            if not heap:
                self.last = -1
                if self.tail is None:
                    raise StopIteration
                return next(self.tail)
            place, j = heapq.heappop(heap)
        elif heap and heap[0][0] < place:
            place, j = heapq.heapreplace(heap, (place, j))
        self.last, self.place = j, place
        return self.rest.waiting[place]

    def pass_over(
        self,
        hopeless: Container[tuple[str, int, int]],
        model: str,
        count: int,
        now: float,
        at: float,
    ) -> None:
        """The request just read was passed over: its shape found no room within its
        model's reservation, which starts `at`. Of the rest of its class's dealt requests,
        read only those that end by `at`: the others cannot start in this pass when there
        is no room for one node of its GPUs. Room within a reservation only shrinks as a
        pass starts requests (each takes GPUs, or holds some of the reservation's spare
        ones), and a request of the class with a node limit or of several nodes needs that
        same room, on fewer nodes or on more."""
        key = (model, count)
        if key in self.passed or (model, count, 1) not in hopeless:
            return
        self.passed[key] = (now, at)  # those still to deal, as they are dealt
        j = self.last
        if j >= 0:  # it came from its class's list, whose rest is cut down now
            self.iters[j] = iter(self.rest.ending_by(key, now, at, self.place))
