"""What the guessing limits cost, now that their counts are database rows: the check every
bearer request passes before its route (milliseconds, median), beside the whole
`GET /api/v1/me` it is part of, measured in turns in the same run; and the write a wrong
token costs (its row and the pruning), on SQLite and on PostgreSQL. The table holds N
attempts in the window first (default 10,000: a guesser spread over as many addresses), so
that the figures are those of a server under attack.

    .venv/bin/python benchmarks/auth_limits.py [-n 10000] [--rounds 200] [--pg URL]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import temp_platform  # also puts tests/ on sys.path
from results import emit
from sqlalchemy import create_engine, insert
from starlette.testclient import TestClient

from factories import make_settings, make_user
from gpulease.backends.fake import FakeBackend
from gpulease.server.app import create_app
from gpulease.server.db import utcnow
from gpulease.server.orm import AuthAttempt
from gpulease.server.runtime import build_runtime
from gpulease.server.services.ratelimit import TOKEN, AuthGuard

TARGET = 0.5  # the check at most half of the request it guards
DEFAULT_PG = os.environ.get("GPULEASE_TEST_PG", "postgresql+psycopg://root@127.0.0.1:5432/test")


def ms(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def seed(url: str, n: int) -> None:
    now = utcnow()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            insert(AuthAttempt),
            [
                {
                    "kind": TOKEN,
                    "subject": "",
                    "address_key": f"198.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
                    "address": "x",
                    "reason": "invalid token",
                    "at": now,
                }
                for i in range(n)
            ],
        )
    engine.dispose()


def measure(name: str, url: str, home: Path, n: int, rounds: int) -> None:
    settings = make_settings(home, url)
    rt = build_runtime(settings, FakeBackend())
    try:
        app = create_app(settings, runtime=rt, reconcilers=False)
        with TestClient(app, client=("203.0.113.5", 4000)) as http:
            ann = make_user(http, "ann")
            seed(url, n)
            guard = AuthGuard(settings, rt.sessions)
            app.state.auth_guard = guard
            checks, requests, writes = [], [], []
            for i in range(rounds):
                checks.append(ms(lambda: guard.check_token("203.0.113.5", ann.token)))
                requests.append(ms(lambda: ann.get("/api/v1/me").raise_for_status()))
                address = f"192.0.{i // 256 % 256}.{i % 256}"
                writes.append(ms(lambda a=address: guard.token_failed(a, "glp_nosuch-token")))
        check, request, write = (statistics.median(x) for x in (checks, requests, writes))
        ratio = check / request
        emit(
            f"bearer check ({name}, {n:,} attempts in the window)",
            f"{check:.2f} ms",
            f"{request:.2f} ms GET /api/v1/me",
            f"{ratio:.2f}×",
            f"≤ {TARGET}× of the request",
            ratio <= TARGET,
        )
        emit(
            f"wrong token's write and pruning ({name})",
            f"{write:.2f} ms",
            f"{request:.2f} ms GET /api/v1/me",
            f"{write / request:.2f}×",
            "",
            None,
        )
    finally:
        rt.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--pg", default=DEFAULT_PG)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        measure(
            "SQLite",
            f"sqlite:///{root / 'sqlite' / 'gpulease.db'}",
            root / "sqlite",
            args.n,
            args.rounds,
        )
        made = temp_platform.pg_database(args.pg)
        if made is None:
            print(f"PostgreSQL not measured: no server answers at {args.pg}")
        else:
            url, name = made
            try:
                measure("PostgreSQL", url, root / "pg", args.n, args.rounds)
            finally:
                temp_platform.drop_pg(args.pg, name)


if __name__ == "__main__":
    main()
