"""Replay a trace through `schedule()`: event-driven (arrivals and completions), the very
policy code the server runs, on a cluster of identical nodes.

Durations are unknown to every policy except `srtf` (the oracle): the others see a learned
estimate, as the server learns it: the median of the user's newest 10 finished jobs. A
preempted job is suspended and later resumes where it stopped (no checkpoint cost).

Estimated starts never change a decision, and each one is a forward simulation of the whole
queue: with `eta_sample` N > 1 only every Nth job (by id) gets its first estimate computed,
and the ETA figures are that sample's. Every other figure is the full replay's.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpulease.scheduler.model import (
    ClusterState,
    Config,
    FairShare,
    Request,
    Running,
    RunningSet,
)
from gpulease.scheduler.placement import FreeMap
from gpulease.scheduler.policy import schedule
from gpulease.scheduler.traces import Job

MODEL = "GPU"
LEARNED_RUNS = 10  # as the server: the median of a user's newest 10 finished runs
ETA_WITHIN_S = 600.0


@dataclass(slots=True)
class Sample:
    at: float
    queued: int
    busy_gpus: int


@dataclass(slots=True)
class Result:
    policy: str
    jobs: int
    gpus: int
    avg_jct: float
    median_jct: float
    p95_jct: float
    avg_queue: float
    median_queue: float
    p95_queue: float
    utilisation: float
    fragmentation: float
    fairness: float
    eta_within_10min: float
    eta_within_25pct: float
    eta_jobs: int  # the jobs the ETA figures are over (every one, or a sample: eta_sample)
    preemptions: int
    dropped: int  # jobs larger than the cluster
    samples: list[Sample] = field(default_factory=list)
    first_starts: dict[int, float] = field(default_factory=dict)  # job id -> first start

    def figures(self) -> dict[str, float | int | str]:
        return {k: getattr(self, k) for k in self.__slots__ if k not in ("samples", "first_starts")}


class _Learner:
    """Each user's learned duration, as the server learns it: the median of their newest
    `recent` durations (the global median of the newest for a newcomer)."""

    def __init__(self, prior: float = 3600.0, recent: int = LEARNED_RUNS) -> None:
        self.recent = recent
        self.last: dict[str, deque[float]] = {}
        self.everyone: deque[float] = deque(maxlen=recent)
        self.prior = prior
        self._cached: dict[str, float] = {}

    def estimate(self, user: str) -> float:
        cached = self._cached.get(user)
        if cached is not None:
            return cached
        last = self.last.get(user) or self.everyone
        value = statistics.median(last) if last else self.prior
        if user in self.last:
            self._cached[user] = value
        return value

    def learn(self, user: str, duration: float) -> None:
        self.last.setdefault(user, deque(maxlen=self.recent)).append(duration)
        self.everyone.append(duration)
        self._cached.pop(user, None)


def _shape(gpus: int, per_node: int) -> tuple[int, int]:
    """(GPUs per node, nodes): a job bigger than one node spreads over whole nodes."""
    if gpus <= per_node:
        return gpus, 1
    nodes = math.ceil(gpus / per_node)
    return math.ceil(gpus / nodes), nodes


def simulate(
    jobs: Sequence[Job],
    nodes: int,
    gpus_per_node: int,
    config: Config,
    samples: int = 0,
    eta_sample: int = 1,
) -> Result:
    """Run every job to completion under `config.policy`; `samples` > 0 keeps about that
    many (time, queue length, busy GPUs) points for a plot; `eta_sample` N estimates the
    first start of every Nth job only (1: all)."""
    if eta_sample < 1:
        raise ValueError("eta_sample must be at least 1")
    free = FreeMap({MODEL: dict.fromkeys(range(nodes), gpus_per_node)})
    total_gpus = nodes * gpus_per_node
    oracle = config.policy == "srtf"
    learner = _Learner()
    share = FairShare(config.half_life)
    running = RunningSet()
    queue: dict[int, Request] = {}
    served: dict[int, float] = {}  # seconds each job has run so far
    first_start: dict[int, float] = {}
    finish: dict[int, float] = {}
    first_eta: dict[int, float | None] = {}
    epoch: dict[int, int] = {}  # bumps on preemption: stale completions are ignored
    completions: list[tuple[float, int, int]] = []
    by_id = {j.id: j for j in jobs}
    node_ids = list(range(nodes))
    kept = [j for j in jobs if j.gpus <= total_gpus]
    dropped = len(jobs) - len(kept)
    arrivals = sorted(kept, key=lambda j: (j.submit, j.id))
    i = 0
    busy = 0
    busy_area = 0.0
    frag_area = 0.0
    frag_time = 0.0
    last = arrivals[0].submit if arrivals else 0.0
    preemptions = 0
    trace: list[Sample] = []

    def request_for(j: Job, attained: float = 0.0) -> Request:
        """The queue entry of trace job j, on arrival or queued again after a preemption."""
        count, n = _shape(j.gpus, gpus_per_node)
        duration = j.duration if oracle else learner.estimate(j.user)
        return Request(
            j.id,
            j.user,
            MODEL,
            count,
            n,
            j.submit,
            j.plan,
            j.team,
            duration=duration,
            attained=attained,
        )

    while i < len(arrivals) or completions:
        now = min(
            arrivals[i].submit if i < len(arrivals) else math.inf,
            completions[0][0] if completions else math.inf,
        )
        busy_area += busy * (now - last)
        last = now
        while completions and completions[0][0] <= now:
            _, jid, ep = heapq.heappop(completions)
            if epoch.get(jid, 0) != ep:
                continue
            r = running.remove(jid)
            free.give(MODEL, r.node_ids, r.count)
            busy -= r.gpus
            share.ended(r.owner, r.gpus, r.start, now)
            finish[jid] = now
            learner.learn(r.owner, by_id[jid].duration)
        new: list[int] = []
        while i < len(arrivals) and arrivals[i].submit <= now:
            j = arrivals[i]
            queue[j.id] = request_for(j)
            new.append(j.id)
            i += 1
        if not queue:
            continue
        state = ClusterState(free, running, list(queue.values()), share.usage(now), node_ids)
        explain = new if eta_sample == 1 else [jid for jid in new if jid % eta_sample == 0]
        decisions = schedule(state, now, config, explain=explain)
        for rid in decisions.preempt:
            r = running.remove(rid)
            free.give(MODEL, r.node_ids, r.count)
            busy -= r.gpus
            share.ended(r.owner, r.gpus, r.start, now)
            served[rid] = served.get(rid, 0.0) + now - r.start
            epoch[rid] = epoch.get(rid, 0) + 1
            preemptions += 1
            j = by_id[rid]
            queue[rid] = request_for(j, attained=served[rid] * j.gpus)
        for start in decisions.starts:
            req = queue.pop(start.request_id)
            j = by_id[req.id]
            done = served.get(req.id, 0.0)
            end = now + j.duration - done
            estimate = req.duration if req.duration is not None else j.duration
            r = Running(
                req.id,
                req.owner,
                MODEL,
                req.count,
                start.node_ids,
                now,
                expected_end=max(now + estimate - done, now),
                plan=req.plan,
                team=req.team,
                duration=j.duration if oracle else None,
                attained=req.attained,
            )
            running.add(r)
            free.take(MODEL, r.node_ids, r.count)
            busy += r.gpus
            share.started(r.owner, r.gpus, now)
            first_start.setdefault(req.id, now)
            heapq.heappush(completions, (end, req.id, epoch.get(req.id, 0)))
        for jid in new:
            if jid % eta_sample:
                continue  # not in the sample (whether it starts now or waits)
            if jid in first_start and first_start[jid] == now:
                first_eta[jid] = now
            else:
                w = decisions.waiting.get(jid)
                first_eta[jid] = w.eta if w is not None else None
        if queue and free.total(MODEL):
            head = (
                min(queue.values(), key=lambda r: (r.arrival, r.id))
                if len(queue) < 64
                else next(iter(queue.values()))
            )
            stranded = free.total_below(MODEL, head.count)
            nxt = min(
                arrivals[i].submit if i < len(arrivals) else math.inf,
                completions[0][0] if completions else math.inf,
            )
            if math.isfinite(nxt):
                frag_area += stranded / free.total(MODEL) * (nxt - now)
                frag_time += nxt - now
        if samples:
            trace.append(Sample(now, len(queue), busy))
    return _result(
        config.policy,
        kept,
        total_gpus,
        first_start,
        finish,
        first_eta,
        busy_area,
        frag_area / frag_time if frag_time else 0.0,
        preemptions,
        dropped,
        trace,
        samples,
        eta_sample,
    )


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _result(
    policy: str,
    jobs: Sequence[Job],
    total_gpus: int,
    first_start: dict[int, float],
    finish: dict[int, float],
    first_eta: dict[int, float | None],
    busy_area: float,
    fragmentation: float,
    preemptions: int,
    dropped: int,
    trace: list[Sample],
    samples: int,
    eta_sample: int = 1,
) -> Result:
    jct = [finish[j.id] - j.submit for j in jobs]
    wait = [first_start[j.id] - j.submit for j in jobs]
    span = max(finish.values()) - min(j.submit for j in jobs) if jobs else 0.0
    slow: dict[str, list[float]] = {}
    for j in jobs:
        slow.setdefault(j.user, []).append((finish[j.id] - j.submit) / max(j.duration, 1.0))
    per_user = [statistics.fmean(v) for v in slow.values()]
    fairness = sum(per_user) ** 2 / (len(per_user) * sum(x * x for x in per_user))
    near = close = 0
    sampled = [j for j in jobs if j.id % eta_sample == 0]
    for j in sampled:
        eta = first_eta.get(j.id)
        if eta is None:
            continue
        err = abs(eta - first_start[j.id])
        near += err <= ETA_WITHIN_S
        close += err <= 0.25 * (first_start[j.id] - j.submit)
    if samples and len(trace) > samples:
        step = len(trace) / samples
        trace = [trace[int(k * step)] for k in range(samples)]
    n = len(jobs)
    return Result(
        policy=policy,
        jobs=n,
        gpus=total_gpus,
        avg_jct=statistics.fmean(jct),
        median_jct=statistics.median(jct),
        p95_jct=_pct(jct, 0.95),
        avg_queue=statistics.fmean(wait),
        median_queue=statistics.median(wait),
        p95_queue=_pct(wait, 0.95),
        utilisation=busy_area / (total_gpus * span) if span else 0.0,
        fragmentation=fragmentation,
        fairness=fairness,
        eta_within_10min=near / len(sampled) if sampled else 0.0,
        eta_within_25pct=close / len(sampled) if sampled else 0.0,
        eta_jobs=len(sampled),
        preemptions=preemptions,
        dropped=dropped,
        samples=trace,
        first_starts=first_start,
    )
