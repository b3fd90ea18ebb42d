"""Metrics: points ingested per second through the runner API, and the delay from a point
POSTed by a runner to the SSE client that shows it.

Measured against a real server process on this host (SQLite; PostgreSQL too when
GPULEASE_TEST_PG reaches one), with a real runner serving a `sleep` run on the local backend:
this script posts as that runner (with its token), as the runner's metrics shipper does.

- ingest: `POST /runner/v1/runs/{id}/metrics` with --batch points (default 1,000) per
  request, beside an empty batch through the same route in the same run (the cost of any
  authenticated request: HTTP, token lookup, one transaction).
- delay: one point POSTed → its `metric` event read by a client of
  `GET /api/v1/runs/{id}/stream`, and the whole path from `track.log` in a run (the SDK's
  line, the runner's batch every 0.5 s, the POST, the stream) to that client, each beside a
  round trip over a local TCP socket.

    .venv/bin/python benchmarks/metrics_ingest.py [-n 30] [--batch 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shlex
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from gpulease.client import GpuleaseClient  # noqa: E402
from gpulease.client.runstream import parse_sse  # noqa: E402
from gpulease.schemas.runs import RunCreate
from processes import Platform, free_port  # noqa: E402

PG_ADMIN_URL = os.environ.get("GPULEASE_TEST_PG", "postgresql+psycopg://root@127.0.0.1:5432/test")
T0 = time.time()


def socket_round_trips(n: int) -> list[float]:
    """Seconds for 64 bytes to go to a local echo server and back, n times."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def echo() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    samples = []
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            started = time.perf_counter()
            client.sendall(b"x" * 64)
            got = 0
            while got < 64:
                got += len(client.recv(4096))
            samples.append(time.perf_counter() - started)
    server.close()
    return samples


class Bench:
    """One platform with a running instance, a `sleep` run and its runner's token."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        platform.cli(
            "register", "--server", platform.url, "--name", "bench", "--password", "password-123"
        )
        platform.cli(
            "instance", "create", "--gpu", "T4:1", "--template", "python", "--name", "box", "--wait"
        )
        self.user_token = str(json.loads(platform.config.read_text())["token"])
        specs = list((platform.home / "runners").glob("*/spec.json"))
        assert len(specs) == 1, specs
        self.runner_token = str(json.loads(specs[0].read_text())["token"])
        self.client = GpuleaseClient(platform.url, self.user_token)
        self.run_id = self.client.runs.create("box", RunCreate(command="sleep 3600")).id
        while self.client.runs.get(self.run_id).status != "running":
            time.sleep(0.1)
        self.http = httpx.Client(
            base_url=platform.url,
            headers={"Authorization": f"Bearer {self.runner_token}"},
            timeout=60,
        )
        self.step = 0

    def post(self, count: int) -> float:
        points = [
            {
                "key": "loss",
                "step": self.step + i,
                "value": 1.0 / (self.step + i + 1),
                "time": T0 + i,
                "source": "sdk",
            }
            for i in range(count)
        ]
        self.step += count
        started = time.perf_counter()
        r = self.http.post(f"/runner/v1/runs/{self.run_id}/metrics", json={"points": points})
        elapsed = time.perf_counter() - started
        assert r.status_code == 204, r.text
        return elapsed

    def delays(self, n: int) -> list[float]:
        """Seconds from POSTing one point to its event arriving on an SSE client."""
        arrived: queue.Queue[tuple[int, float]] = queue.Queue()
        last = self.client.runs.metrics(self.run_id, ["loss"], max_points=10).last_point_id
        stop = threading.Event()

        def listen() -> None:
            headers = {"Authorization": f"Bearer {self.user_token}"}
            params = {"since": f"-1:{last}", "logs": "false"}
            url = f"{self.platform.url}/api/v1/runs/{self.run_id}/stream"
            with httpx.stream("GET", url, params=params, headers=headers, timeout=None) as r:
                for message in parse_sse(r.iter_lines()):
                    now = time.perf_counter()
                    if message.event == "metric":
                        for p in json.loads(message.data)["points"]:
                            arrived.put((p["step"], now))
                    if stop.is_set():
                        return

        threading.Thread(target=listen, daemon=True).start()
        time.sleep(1.0)  # let the stream connect and go idle
        samples = []
        for _ in range(n):
            step = self.step
            started = time.perf_counter()
            self.post(1)
            while True:
                got, at = arrived.get(timeout=30)
                if got == step:
                    samples.append(at - started)
                    break
            time.sleep(0.05)
        stop.set()
        self.post(1)  # wakes the listener so that it sees stop
        return samples

    def track_delays(self, n: int) -> list[float]:
        """Seconds from `track.log` in a run to its point arriving on an SSE client: the
        whole path (the SDK's line, the runner's batch, the POST, the server, the stream).
        The run logs its own time.time() as the value; both ends read this host's clock."""
        script = (
            "import time\nfrom gpulease import track\n"
            f"for i in range({n}):\n"
            "    track.log(step=i, sent=time.time())\n"
            "    time.sleep(0.3)\n"
        )
        run_id = self.client.runs.create(
            "box", RunCreate(command="python -c " + shlex.quote(script))
        ).id
        samples: list[float] = []
        headers = {"Authorization": f"Bearer {self.user_token}"}
        params = {"since": "-1:0", "logs": "false"}
        url = f"{self.platform.url}/api/v1/runs/{run_id}/stream"
        with httpx.stream("GET", url, params=params, headers=headers, timeout=120) as r:
            for message in parse_sse(r.iter_lines()):
                now = time.time()
                if message.event == "metric":
                    for p in json.loads(message.data)["points"]:
                        if p["key"] == "sent":
                            samples.append(now - float(p["value"]))
                if message.event == "end" or len(samples) >= n:
                    break
        assert len(samples) == n, f"got {len(samples)} of {n} points from the run"
        return samples

    def close(self) -> None:
        self.http.close()
        self.client.close()


def measure(
    console: Console, label: str, database_url: str, n: int, batch: int
) -> list[tuple[str, list[float], str]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        platform = Platform(
            home=root / "home",
            database_url=database_url.replace("{root}", str(root)),
            port=free_port(),
            simulated="T4:1",
            log_path=root / "server.log",
            config=root / "cli.json",
        )
        platform.start()
        try:
            with console.status(f"{label}: starting an instance (builds the python template once)"):
                bench = Bench(platform)
            with console.status(f"{label}: ingest"):
                bench.post(batch)  # warm up
                empty = [bench.post(0) for _ in range(n)]
                full = [bench.post(batch) for _ in range(n)]
            with console.status(f"{label}: delay to an SSE client"):
                delays = bench.delays(n)
            with console.status(f"{label}: delay from track.log in a run to an SSE client"):
                track_delays = bench.track_delays(n)
            bench.close()
        finally:
            platform.end_runners()
            platform.stop()
    return [
        (f"{label}: empty batch request (baseline)", empty, "s"),
        (f"{label}: batch of {batch} points", full, "s"),
        (f"{label}: point POSTed → SSE event", delays, "s"),
        (f"{label}: track.log in a run → SSE event", track_delays, "s"),
    ]


def pg_database() -> tuple[str, str] | None:
    try:
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        name = f"gpulease_bench_{uuid.uuid4().hex[:8]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
    except Exception:
        return None
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name, name


def drop_pg(name: str) -> None:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :n AND pid <> pg_backend_pid()"
            ),
            {"n": name},
        )
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    console = Console()
    rows = measure(console, "SQLite", "sqlite:///{root}/home/gpulease.db", args.n, args.batch)
    pg = pg_database()
    if pg is None:
        console.print(f"[dim]PostgreSQL not reachable at {PG_ADMIN_URL}: SQLite only[/dim]")
    else:
        try:
            rows += measure(console, "PostgreSQL", pg[0], args.n, args.batch)
        finally:
            drop_pg(pg[1])
    socket_rt = socket_round_trips(max(args.n, 100))

    table = Table(title=f"metrics ingest and delivery, median of {args.n} (this host)")
    for col in ("what", "median ms", "p90 ms", "points/s", "× baseline"):
        table.add_column(col, justify="left" if col == "what" else "right")
    base_socket = statistics.median(socket_rt)
    table.add_row(
        "local TCP socket round trip (baseline)",
        f"{base_socket * 1000:.3f}",
        f"{statistics.quantiles(socket_rt, n=10)[-1] * 1000:.3f}",
        "",
        "1.0",
    )
    base_empty = 0.0
    for label, samples, _ in rows:
        med = statistics.median(samples)
        p90 = statistics.quantiles(samples, n=10)[-1] if len(samples) > 1 else med
        if "baseline" in label:
            base_empty = med
            table.add_row(label, f"{med * 1000:.2f}", f"{p90 * 1000:.2f}", "", "1.0")
        elif "points" in label:
            rate = f"{args.batch / med:,.0f}"
            table.add_row(
                label, f"{med * 1000:.2f}", f"{p90 * 1000:.2f}", rate, f"{med / base_empty:.1f}"
            )
        else:
            table.add_row(
                label, f"{med * 1000:.2f}", f"{p90 * 1000:.2f}", "", f"{med / base_socket:.0f}"
            )
    console.print(table)


if __name__ == "__main__":
    main()
