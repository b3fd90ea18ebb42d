"""The reconciler loop's tick on a quiet server, and how long of it the tick holds SQLite's
write lock (every API write waits while it does). The tick runs every step (as the loop's
first turn does), over an empty fleet and over N running instances whose runners have just
heartbeated (nothing to do for any step); the write lock is held from a write transaction's
BEGIN IMMEDIATE to its COMMIT. The baseline is the tick itself, in the same run: the share
of the tick spent holding the lock, and the number of write transactions a tick opens (on
PostgreSQL each one BEGIN and COMMIT more; a read-only one is autocommit statements).
Median of --ticks ticks (after a few to warm up), each in a fresh process per round.

    .venv/bin/python benchmarks/reconciler_tick.py [--running 500] [--ticks 40] [--rounds 5]
        [--pg postgresql://root@127.0.0.1/test]   # the tick's time on PostgreSQL too
        [--against OLD/src]   # the same rounds on another copy of gpulease, in turns
        [--idle-ceiling 60]   # the operator's idle-stop ceiling: every running instance is
                              # then looked at by idle stop (none is idle for long yet)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from billing_tick import running_rows
from results import emit
from rich.console import Console
from rich.table import Table
from temp_platform import drop_pg, pg_database

WARMUP = 5


def child(url: str, home: Path, running: int, ticks: int, ceiling: int) -> dict[str, Any]:
    """Build a server runtime on url (a fake backend), add `running` instances, time ticks."""
    from datetime import timedelta

    from sqlalchemy import event, insert, select

    from gpulease.backends.fake import FakeBackend
    from gpulease.server.db import transaction, utcnow
    from gpulease.server.orm import Instance, User
    from gpulease.server.reconcilers.loop import run_once
    from gpulease.server.runtime import build_runtime
    from gpulease.server.settings import Settings

    settings = Settings(  # type: ignore[arg-type]
        home=home,
        database_url=url,
        simulated_gpus="T4:1",
        admin_password="x" * 12,
        idle_stop_max_minutes=ceiling or None,
    )
    rt = build_runtime(settings, FakeBackend())
    now = utcnow()
    with transaction(rt.sessions) as session:
        owner = session.scalar(select(User.id).limit(1))
        if running:
            rows = running_rows(owner, running, now)
            for i, row in enumerate(rows):
                row["runner_handle"] = f"fake-{i}"
                row["started_at"] = now
                row["last_heartbeat_at"] = now + timedelta(days=1)  # never silent here
            session.execute(insert(Instance), rows)

    sqlite = rt.engine.dialect.name == "sqlite"
    held: list[float] = []
    opened: dict[int, float] = {}

    @event.listens_for(rt.engine, "begin")
    def _begin(conn: Any) -> None:
        # a read-only transaction: a deferred BEGIN on SQLite, autocommit on PostgreSQL
        options = conn.get_execution_options()
        if not options.get("gpulease_read_only") and options.get("isolation_level") != "AUTOCOMMIT":
            opened[id(conn)] = time.perf_counter()

    def _end(conn: Any) -> None:
        began = opened.pop(id(conn), None)
        if began is not None:
            held.append(time.perf_counter() - began)

    event.listen(rt.engine, "commit", _end)
    event.listen(rt.engine, "rollback", _end)

    tick_s, lock_s, writes = [], [], []
    for n in range(WARMUP + ticks):
        held.clear()
        began = time.perf_counter()
        run_once(rt)
        took = time.perf_counter() - began
        if n >= WARMUP:
            tick_s.append(took)
            lock_s.append(sum(held) if sqlite else 0.0)
            writes.append(len(held))
    rt.engine.dispose()
    return {
        "tick_ms": statistics.median(tick_s) * 1000,
        "lock_ms": statistics.median(lock_s) * 1000,
        "writes": statistics.median(writes),
    }


def one_round(src: Path | None, url: str, running: int, ticks: int, ceiling: int) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = f"{src}{os.pathsep}{env.get('PYTHONPATH', '')}"
    with tempfile.TemporaryDirectory(prefix="gpulease-tick-") as tmp:
        db_url = url or f"sqlite:///{tmp}/gpulease.db"
        argv = [sys.executable, __file__, "--child", db_url, tmp, str(running), str(ticks)]
        argv.append(str(ceiling))
        out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        url, home = sys.argv[2], Path(sys.argv[3])
        running, ticks, ceiling = map(int, sys.argv[4:7])
        print(json.dumps(child(url, home / "home", running, ticks, ceiling)))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--running", type=int, default=500)
    parser.add_argument("--ticks", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pg", default=None, help="a PostgreSQL URL to measure the tick on too")
    parser.add_argument("--against", type=Path, default=None, help="another copy's src folder")
    parser.add_argument(
        "--idle-ceiling", type=int, default=0, help="the operator's idle-stop ceiling, minutes"
    )
    args = parser.parse_args()

    trees: list[tuple[str, Path | None]] = [("this code", None)]
    if args.against is not None:
        trees.append((f"against {args.against}", args.against.resolve()))
    databases = ["sqlite"] + (["postgres"] if args.pg else [])
    fleets = [0, args.running] if args.running else [0]
    results: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for db in databases:
            for fleet in fleets:
                for label, src in trees:  # in turns: the host's drift falls on both alike
                    if db == "postgres":
                        made = pg_database(args.pg)
                        if made is None:
                            parser.error(f"no PostgreSQL server answers at {args.pg}")
                        url, name = made
                        try:
                            got = one_round(src, url, fleet, args.ticks, args.idle_ceiling)
                        finally:
                            drop_pg(args.pg, name)
                    else:
                        got = one_round(src, "", fleet, args.ticks, args.idle_ceiling)
                    results.setdefault((label, db, fleet), []).append(got)

    ceiling = f", idle-stop ceiling {args.idle_ceiling} min" if args.idle_ceiling else ""
    table = Table(title=f"reconciler tick, every step, median of {args.rounds} rounds{ceiling}")
    for col in ("code", "database", "running", "tick ms", "write lock ms", "share", "writes"):
        table.add_column(col)
    for (label, db, fleet), rounds in results.items():
        tick = statistics.median(r["tick_ms"] for r in rounds)
        lock = statistics.median(r["lock_ms"] for r in rounds)
        writes = statistics.median(r["writes"] for r in rounds)
        share = f"{lock / tick:.0%}" if db == "sqlite" else "—"
        shown_lock = f"{lock:.2f}" if db == "sqlite" else "—"
        table.add_row(label, db, str(fleet), f"{tick:.2f}", shown_lock, share, f"{writes:g}")
        if label == "this code" and db == "sqlite":
            emit(
                f"quiet tick, {fleet} running{ceiling}: SQLite write lock held",
                f"{lock:.2f} ms ({writes:g} write transactions)",
                f"the tick {tick:.2f} ms",
                f"{lock / tick:.2f}×",
                "",
                None,
            )
    Console().print(table)


if __name__ == "__main__":
    main()
