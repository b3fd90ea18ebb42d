"""A billing tick over N running instances (default 10,000): milliseconds per tick on SQLite
and on PostgreSQL, beside a bare bulk insert of N rows into the same database in the same
run, in turns with the ticks (the floor any per-instance write has to stand on). Every tick
bills all N segments (each a minute further on), so each writes N transactions, 2N
entries and N segment updates. The ratio is median tick over median insert; "rounds" is
the lowest and highest of each round's tick over the insert taken beside it.

    .venv/bin/python benchmarks/billing_tick.py [-n 10000] [--pg postgresql://root@127.0.0.1/test]
        [--before REV]   # also the tick of services/metering.py at REV, in turns, same database
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from results import emit
from rich.console import Console
from rich.table import Table
from sqlalchemy import insert, text
from temp_platform import drop_pg, pg_database

from gpulease.server.db import make_engine, make_sessionmaker, migrate, transaction, utcnow
from gpulease.server.orm import Instance, Notification, UsageSegment, User

TARGET = 3.0


def running_rows(owner_id: int, n: int, now: datetime) -> list[dict[str, Any]]:
    """n running T4 instances of owner_id, as rows to insert."""
    return [
        {
            "owner_id": owner_id,
            "name": f"b{i}",
            "gpu_model": "T4",
            "gpu_count": 1,
            "template": "python",
            "hourly_micro": 250_000,
            "status": "running",
            "desired_state": "running",
            "created_at": now,
            "updated_at": now,
        }
        for i in range(n)
    ]


def prepare(url: str, n: int) -> None:
    engine = make_engine(url)
    migrate(engine)
    now = utcnow()
    with engine.begin() as conn:
        user_id = conn.execute(
            insert(User).values(name="bench", password_hash="x", role="user", created_at=now)
        ).inserted_primary_key[0]
        conn.execute(insert(Instance), running_rows(user_id, n, now))
        ids = [row[0] for row in conn.execute(text("SELECT id FROM instances ORDER BY id"))]
        conn.execute(
            insert(UsageSegment),
            [
                {
                    "instance_id": i,
                    "owner_id": user_id,
                    "gpu_model": "T4",
                    "gpu_count": 1,
                    "hourly_micro": 250_000,
                    "plan": "on_demand",
                    "offpeak": {},
                    "started_at": now - timedelta(hours=1),
                    "billed_seconds": 0,
                    "charged_micro": 0,
                }
                for i in ids
            ],
        )
    engine.dispose()


def measure(
    url: str, n: int, rounds: int, before: ModuleType | None = None
) -> tuple[list[float], list[float], list[float]]:
    """Milliseconds of each tick, of each bulk insert of n rows and of each tick by `before`
    (another version of services/metering.py; none without it), taken in turns so that load
    from the rest of the host falls on all alike."""
    from gpulease.server.services import metering

    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    ticks: list[float] = []
    inserts: list[float] = []
    before_ticks: list[float] = []
    minute = 0
    for r in range(rounds):
        turns = [(metering, ticks)] + ([(before, before_ticks)] if before else [])
        for module, times in turns if r % 2 == 0 else turns[::-1]:
            minute += 1  # each tick bills every segment a minute further on
            started = time.perf_counter()
            with transaction(sessions) as session:
                module.charge_open_segments(session, utcnow() + timedelta(seconds=60 * minute))
            times.append((time.perf_counter() - started) * 1000)
        now = utcnow()
        rows = [
            {"user_id": 1, "kind": "bench", "message": f"{r}-{i}", "created_at": now}
            for i in range(n)
        ]
        started = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(insert(Notification), rows)
        inserts.append((time.perf_counter() - started) * 1000)
    engine.dispose()
    return ticks, inserts, before_ticks


def metering_at(revision: str, folder: Path) -> ModuleType:
    """services/metering.py as it was at a git revision, importable beside the current one."""
    source = subprocess.run(
        ["git", "show", f"{revision}:src/gpulease/server/services/metering.py"],
        cwd=Path(__file__).resolve().parent.parent,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = folder / "metering_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("metering_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _spread(ticks: list[float], inserts: list[float]) -> str:
    """The lowest and highest of each round's tick over the insert taken beside it: how far
    the load moves the ratio."""
    each = sorted(tick / insert for tick, insert in zip(ticks, inserts, strict=True))
    return f"{each[0]:.1f}–{each[-1]:.1f}×"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--pg", default="postgresql+psycopg://root@127.0.0.1:5432/test")
    parser.add_argument(
        "--before",
        metavar="REV",
        help="also tick with services/metering.py at this git revision, in turns with the "
        "current one on the same database (a row of its own; no result line)",
    )
    args = parser.parse_args()
    console = Console()
    table = Table(title=f"billing tick over {args.n:,} running instances (median of {args.rounds})")
    for col in ("database", "tick ms", "bulk insert ms", "tick / insert", "rounds"):
        table.add_column(col, justify="right" if col != "database" else "left")
    with tempfile.TemporaryDirectory() as tmp:
        before = metering_at(args.before, Path(tmp)) if args.before else None
        targets = [("SQLite", f"sqlite:///{Path(tmp) / 'bench.db'}", None)]
        made = pg_database(args.pg)
        if made is None:  # no server: report SQLite only, and say so
            console.print(f"[yellow]PostgreSQL skipped: no server answers at {args.pg}")
        else:
            targets.append(("PostgreSQL", *made))
        try:
            for label, url, _ in targets:
                with console.status(f"{label}: preparing {args.n:,} instances"):
                    prepare(url, args.n)
                with console.status(f"{label}: ticking"):
                    ticks, inserts, before_ticks = measure(url, args.n, args.rounds, before)
                t, b = statistics.median(ticks), statistics.median(inserts)
                spread = _spread(ticks, inserts)
                table.add_row(label, f"{t:,.0f}", f"{b:,.0f}", f"{t / b:.1f}×", spread)
                if before_ticks:
                    was = statistics.median(before_ticks)
                    table.add_row(
                        f"{label}, metering.py at {args.before}",
                        f"{was:,.0f}",
                        f"{b:,.0f}",
                        f"{was / b:.1f}×",
                        _spread(before_ticks, inserts),
                    )
                emit(
                    f"billing tick, {args.n:,} running instances ({label})",
                    f"{t:,.0f} ms",
                    f"bulk insert of {args.n:,} rows {b:,.0f} ms",
                    f"{t / b:.1f}× (rounds {spread})",
                    f"<= {TARGET:.0f}×",
                    t / b <= TARGET,
                )
        finally:
            for _, _, db in targets:
                if db:
                    drop_pg(args.pg, db)
    console.print(table)


if __name__ == "__main__":
    main()
