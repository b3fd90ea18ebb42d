"""What the scheduling policy sees and says: the cluster, the queue, the decisions (plain data).

Times are seconds on any one clock the caller chooses (the server uses epoch seconds, the
simulator trace seconds); the policy never reads a clock of its own.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import ItemsView, Iterable, Iterator, Mapping, Sequence, ValuesView
from dataclasses import dataclass, field
from typing import NamedTuple

from gpulease.scheduler.placement import FreeMap

ON_DEMAND, DAILY, SPOT = "on_demand", "daily", "spot"
PLAN_RANK = {DAILY: 0, ON_DEMAND: 0, SPOT: 1}  # daily and on demand before spot


@dataclass(frozen=True, slots=True)
class Request:
    """A queued instance: `count` GPUs of `model` on each of `nodes` nodes (a gang starts
    all together or not at all). `duration` is declared or learned (None: unknown);
    `attained` is the GPU-seconds it already ran before a preemption put it back."""

    id: int
    owner: str
    model: str
    count: int = 1
    nodes: int = 1
    arrival: float = 0.0
    plan: str = ON_DEMAND
    team: str | None = None
    priority: int = 0  # admin-set for the user or team: higher goes first
    duration: float | None = None
    attained: float = 0.0
    allowed: frozenset[int] | None = None  # nodes that can run it (their driver); None: any
    home: int | None = None  # the node it last ran on: placed there again when it fits

    @property
    def gpus(self) -> int:
        return self.count * self.nodes


@dataclass(frozen=True, slots=True)
class Running:
    """An instance holding GPUs: `count` of `model` on each node in `node_ids`."""

    id: int
    owner: str
    model: str
    count: int
    node_ids: tuple[int, ...]
    start: float
    expected_end: float | None = None  # None: unknown (it holds its GPUs until stopped)
    plan: str = ON_DEMAND
    team: str | None = None
    priority: int = 0
    duration: float | None = None  # the oracle's knowledge (srtf); None elsewhere
    attained: float = 0.0  # GPU-seconds before this start (preempted and resumed)
    # Already told to stop (preempted, or stopped by its owner): its GPUs come back soon, so
    # it is never chosen again and a blocked request counts on them before preempting more.
    stopping: bool = False

    @property
    def gpus(self) -> int:
        return self.count * len(self.node_ids)


_AT = operator.itemgetter(0)


class RunningSet:
    """The running instances, with what the policy asks of them every tick kept up to date
    as they come and go: GPUs held per owner and per team, and expected ends in order."""

    def __init__(self, running: Iterable[Running] = ()) -> None:
        self.by_id: dict[int, Running] = {}
        self.held_user: dict[str, int] = {}
        self.held_team: dict[str, int] = {}
        # (expected end, node ids, instance) for the known ends, in time order (among equal
        # ends, as added): the very entries the policy's timeline reads, made once per instance
        self.ends: list[tuple[float, tuple[int, ...], Running]] = []
        for r in running:
            self.add(r)

    def add(self, r: Running) -> None:
        self.by_id[r.id] = r
        self.held_user[r.owner] = self.held_user.get(r.owner, 0) + r.gpus
        if r.team is not None:
            self.held_team[r.team] = self.held_team.get(r.team, 0) + r.gpus
        if r.expected_end is not None:
            bisect.insort(self.ends, (r.expected_end, r.node_ids, r), key=_AT)

    def remove(self, running_id: int) -> Running:
        r = self.by_id.pop(running_id)
        self.held_user[r.owner] -= r.gpus
        if r.team is not None:
            self.held_team[r.team] -= r.gpus
        if r.expected_end is not None:
            ends = self.ends
            i = bisect.bisect_left(ends, r.expected_end, key=_AT)
            while ends[i][2] is not r:  # among those that end at the same time
                i += 1
            del ends[i]
        return r

    def __iter__(self) -> Iterator[Running]:
        return iter(self.by_id.values())

    def __len__(self) -> int:
        return len(self.by_id)


@dataclass(slots=True)
class ClusterState:
    """The cluster now. `free` is GPUs free per model per node; `queue` is in arrival
    order; `usage` is each owner's recent GPU-seconds (decayed, running included: see
    FairShare)."""

    free: FreeMap
    running: RunningSet
    queue: Sequence[Request]
    usage: Mapping[str, float] = field(default_factory=dict)
    node_ids: Sequence[int] = ()  # every ready node (CPU-only requests need just a node)


@dataclass(frozen=True, slots=True)
class Config:
    """Policy settings. `reservations` is how many blocked requests per GPU model hold a
    reserved start that backfill must not delay (1 = EASY)."""

    policy: str = "default"
    half_life: float = 7 * 86400.0
    user_quota: Mapping[str, int] = field(default_factory=dict)
    team_quota: Mapping[str, int] = field(default_factory=dict)
    default_user_quota: int | None = None
    default_team_quota: int | None = None
    reservations: int = 1
    spot_preemption: bool = True
    las_thresholds: tuple[float, ...] = (3600.0, 36000.0, 360000.0)
    eta_events: int = 500  # the forward simulation's budget of starts; beyond: no ETA


@dataclass(frozen=True, slots=True)
class Start:
    request_id: int
    node_ids: tuple[int, ...]  # one per gang member


# A named tuple: a tick makes one for every waiting request, and the policy makes them with
# tuple.__new__, which costs a third of a dataclass's __init__.
class Waiting(NamedTuple):
    request_id: int
    position: int  # 1-based among the requests for its GPU model, in policy order
    cause: str  # why it waits, without its place: the same words for many requests
    eta: float | None  # when the forward simulation starts it; None: not known

    @property
    def reason(self) -> str:
        """Why it waits, in words, with how many requests are ahead of it: 'needs 4 ×
        A100-80GB on one node; the largest free block is 2; 3 requests ahead of you'. Put
        together when read, not by the tick: at scale a tick has thousands of waiting
        requests, most of whose words are never read (the simulator reads only estimates)."""
        words = _AHEAD
        if self.position >= len(words):
            words = _ahead(self.position)
        return self.cause + words[self.position]


# "; n requests ahead of you" at place n + 1 ("" at 1), by place, made once for every
# answer: a longer list replaces it whole, so a thread reading the old one reads it complete
_AHEAD: list[str] = ["", "", "; 1 request ahead of you"]


def _ahead(place: int) -> list[str]:
    global _AHEAD
    words = _AHEAD
    if len(words) <= place:
        more = range(len(words), 2 * place + 1)
        words = _AHEAD = words + [f"; {n - 1} requests ahead of you" for n in more]
    return words


class WaitingSet(Mapping[int, Waiting]):
    """Why each waiting request waits, by request id, read as a Mapping of Waiting answers.

    A tick answers for thousands of waiting requests, and most answers are never read (the
    simulator reads a few estimates), so it makes nothing per request: it keeps the
    waiting requests with their places, the reasons its pass gave by id, the ETAs by id
    and the free GPUs it left; an answer is put together from them when it is read (a
    request without a reason of the pass waits for room: the words of its model and
    shape, worded once per shape on the free GPUs the tick left). Reading them all (values,
    items) makes them all at once and keeps them. Reading decides nothing. Read-only;
    `free` must not change after (the tick's own copy)."""

    __slots__ = ("_requests", "_places", "_why", "_etas", "_free", "_needs", "_index", "_made")

    def __init__(
        self,
        requests: Sequence[Request] = (),
        places: Sequence[int] = (),
        why: Mapping[int, str] | None = None,
        etas: Mapping[int, float] | None = None,
        free: FreeMap | None = None,
    ) -> None:
        """`places[k]` is the place of `requests[k]` (distinct ids). `why` and `etas` may
        hold ids that are not waiting (they are never read)."""
        self._requests = requests
        self._places = places
        self._why: Mapping[int, str] = why if why is not None else {}
        self._etas: Mapping[int, float] = etas if etas is not None else {}
        self._free = free if free is not None else FreeMap()
        # model -> shape (count, or (count, nodes) for a gang) -> why it waits for room
        self._needs: dict[str, dict[int | tuple[int, int], str]] = {}
        self._index: dict[int, int] | None = None  # request id -> k, made on the first look
        self._made: dict[int, Waiting] | None = None  # every answer, once all were read

    def _cause(self, req: Request) -> str:
        cause = self._why.get(req.id)
        if cause is None:
            shapes = self._needs.setdefault(req.model, {})
            shape = req.count if req.nodes == 1 else (req.count, req.nodes)
            cause = shapes.get(shape)
            if cause is None:
                cause = shapes[shape] = needs_words(req.model, req.count, req.nodes, self._free)
        return cause

    def _at(self) -> dict[int, int]:
        index = self._index
        if index is None:
            ids = map(_BY_ID, self._requests)
            index = self._index = dict(zip(ids, range(len(self._requests)), strict=False))
        return index

    def _all(self) -> dict[int, Waiting]:
        """Every answer, made in one go (a request's cause as _cause, with less per
        request: the shapes of one model are looked up while the model stays the same)."""
        made = self._made
        if made is not None:
            return made
        made = {}
        why, eta, needs, free = self._why.get, self._etas.get, self._needs, self._free
        make = tuple.__new__
        model = None
        shapes: dict[int | tuple[int, int], str] = {}
        for req, place in zip(self._requests, self._places, strict=True):
            rid = req.id
            cause = why(rid)
            if cause is None:
                if req.model != model:
                    model = req.model
                    shapes = needs.setdefault(model, {})
                shape = req.count if req.nodes == 1 else (req.count, req.nodes)
                cause = shapes.get(shape)
                if cause is None:
                    cause = shapes[shape] = needs_words(model, req.count, req.nodes, free)
            made[rid] = make(Waiting, (rid, place, cause, eta(rid)))
        self._made = made
        return made

    def __getitem__(self, request_id: int) -> Waiting:
        if self._made is not None:
            return self._made[request_id]
        k = self._at()[request_id]
        req = self._requests[k]
        facts = (request_id, self._places[k], self._cause(req), self._etas.get(request_id))
        return tuple.__new__(Waiting, facts)

    def __contains__(self, request_id: object) -> bool:
        if self._made is not None:
            return request_id in self._made
        return request_id in self._at()

    def __iter__(self) -> Iterator[int]:
        return map(_BY_ID, self._requests)

    def __len__(self) -> int:
        return len(self._requests)

    def values(self) -> ValuesView[Waiting]:
        return self._all().values()

    def items(self) -> ItemsView[int, Waiting]:
        return self._all().items()

    def __repr__(self) -> str:
        return f"WaitingSet({self._all()!r})"


def needs_words(model: str, count: int, nodes: int, free: FreeMap) -> str:
    """Why a request for `count` × `model` on each of `nodes` nodes waits for room."""
    if nodes > 1:
        having = sum(1 for n in free.nodes(model).values() if n >= count)
        return (
            f"needs {nodes} nodes with {count} × {model} free each (all at once); "
            f"{having} node{'s' if having != 1 else ''} can take that now"
        )
    largest = free.largest(model)
    return f"needs {count} × {model} on one node; the largest free block is {largest}"


_BY_ID = operator.attrgetter("id")


@dataclass(slots=True)
class Decisions:
    starts: list[Start] = field(default_factory=list)
    preempt: list[int] = field(default_factory=list)  # running ids to stop (spot, or las/srtf)
    # A start that takes GPUs from running instances (preempted now, or already stopping):
    # request id -> those running ids. It can begin only once they have given them back.
    reclaiming: dict[int, list[int]] = field(default_factory=dict)
    waiting: Mapping[int, Waiting] = field(default_factory=WaitingSet)


class FairShare:
    """Each owner's GPU-seconds with exponential decay: finished work decays with the
    half-life; running work counts in full until it ends (then it decays from its end)."""

    def __init__(self, half_life: float) -> None:
        self.rate = math.log(2) / half_life
        self._done: dict[str, tuple[float, float]] = {}  # owner -> (value, as of)
        self._gpus: dict[str, int] = {}  # running GPUs per owner
        self._gpu_start: dict[str, float] = {}  # sum of gpus × start per owner

    def started(self, owner: str, gpus: int, at: float) -> None:
        self._gpus[owner] = self._gpus.get(owner, 0) + gpus
        self._gpu_start[owner] = self._gpu_start.get(owner, 0.0) + gpus * at

    def ended(self, owner: str, gpus: int, started: float, at: float) -> None:
        self._gpus[owner] -= gpus
        self._gpu_start[owner] -= gpus * started
        self.add(owner, gpus * (at - started), at)

    def add(self, owner: str, gpu_seconds: float, at: float) -> None:
        value, stamp = self._done.get(owner, (0.0, at))
        self._done[owner] = (value * math.exp(-self.rate * max(0.0, at - stamp)) + gpu_seconds, at)

    def usage(self, now: float) -> dict[str, float]:
        out = {
            owner: value * math.exp(-self.rate * max(0.0, now - stamp))
            for owner, (value, stamp) in self._done.items()
        }
        for owner, gpus in self._gpus.items():
            if gpus:
                out[owner] = out.get(owner, 0.0) + gpus * now - self._gpu_start[owner]
        return out
