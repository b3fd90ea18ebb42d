"""One scheduling tick with 10,000 queued requests on 1,000 nodes × 8 GPUs: milliseconds per
tick and decisions per second for each policy, beside the time to merely sort the same queue
by (arrival, id) in the same run (the floor any ordering has to stand on). Median of 5.
`--clock cpu` times CPU time instead of wall time: on a machine shared with other work, it
moves far less with the load. A waiting request's answer is put together when it is read
(the server reads every one, the simulator a few): the time to read them all after a tick,
each time on a tick of its own, is shown beside it, not in it.

    .venv/bin/python benchmarks/scheduler_tick.py [-n 10000] [--nodes 1000] [--policy default]
        [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from results import emit
from rich.console import Console
from rich.table import Table

from gpulease.scheduler.model import (
    ClusterState,
    Config,
    Decisions,
    Request,
    Running,
    RunningSet,
)
from gpulease.scheduler.placement import FreeMap
from gpulease.scheduler.policy import POLICIES, schedule

MODEL = "A100-80GB"


def build(n: int, nodes: int, seed: int = 1) -> ClusterState:
    """A busy cluster: most GPUs held by running jobs with known ends, the rest free in
    fragments; n queued requests of 1-8 GPUs (some gangs) from 50 users."""
    rng = random.Random(seed)
    free = dict.fromkeys(range(nodes), 8)
    running = RunningSet()
    rid = 10**6
    for node in range(nodes):
        while free[node] and rng.random() < 0.85:
            c = rng.randint(1, free[node])
            free[node] -= c
            end = rng.uniform(60, 86400)
            running.add(Running(rid, f"u{rng.randrange(50)}", MODEL, c, (node,), 0.0, end))
            rid += 1
    queue = [
        Request(
            i,
            f"u{rng.randrange(50)}",
            MODEL,
            rng.choice((1, 1, 1, 2, 4, 8)),
            2 if rng.random() < 0.02 else 1,
            float(i),
            duration=rng.uniform(60, 86400),
        )
        for i in range(n)
    ]
    usage = {f"u{k}": rng.uniform(0, 1e6) for k in range(50)}
    return ClusterState(FreeMap({MODEL: free}), running, queue, usage, list(range(nodes)))


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def median_ms(fn: object, repeat: int = 5, setup: object = None) -> float:
    """Median milliseconds of `fn()`, each after an untimed `setup()` if given."""
    times = []
    for _ in range(repeat):
        if setup is not None:
            setup()  # type: ignore[operator]
        t = clock()
        fn()  # type: ignore[operator]
        times.append((clock() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--policy", default=",".join(POLICIES))
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    state = build(args.n, args.nodes)
    sort_ms = median_ms(lambda: sorted(state.queue, key=lambda r: (r.arrival, r.id)))
    table = Table(
        "policy",
        "ms per tick (all explained)",
        "ms per tick (no ETAs)",
        "ms to read every reason",
        "decisions/s",
        "starts",
    )
    for name in args.policy.split(","):
        config = Config(policy=name)
        full = median_ms(lambda c=config: schedule(state, 0.0, c))
        lean = median_ms(lambda c=config: schedule(state, 0.0, c, explain=()))
        d = schedule(state, 0.0, config)
        decisions = len(d.starts) + len(d.preempt) + len(d.waiting)
        # each read on the answers of a tick of its own (answers read once are kept)
        ticks: list[Decisions] = []
        words = median_ms(
            lambda t=ticks: [w.reason for w in t.pop().waiting.values()],
            setup=lambda c=config, t=ticks: t.append(schedule(state, 0.0, c)),
        )
        table.add_row(
            name,
            f"{full:.1f}",
            f"{lean:.1f}",
            f"{words:.1f}",
            f"{decisions / (full / 1000):,.0f}",
            str(len(d.starts)),
        )
        emit(
            f"scheduling tick, {args.n:,} queued on {args.nodes:,} nodes × 8 GPUs ({name}, "
            f"{args.clock} time)",
            f"{full:.1f} ms",
            f"sorting the queue {sort_ms:.1f} ms",
            f"{full / sort_ms:.1f}×",
            "<= 20× a sort and < 100 ms",
            full <= 20 * sort_ms and full < 100,
        )
    console = Console()
    console.print(
        f"{args.n:,} queued, {args.nodes:,} nodes × 8 GPUs, {len(state.running):,} running, "
        f"{state.free.total(MODEL):,} GPUs free; sorting the queue alone: {sort_ms:.1f} ms"
    )
    console.print(table)


if __name__ == "__main__":
    main()
