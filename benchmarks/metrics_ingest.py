"""Metrics: points ingested per second through the runner API, and the delay from a point
POSTed by a runner to the SSE client that shows it.

Measured against real server processes on this host (SQLite; PostgreSQL too when
GPULEASE_TEST_PG reaches one):

- ingest and POST → SSE delay: a server whose backend hands the launch spec over instead of
  starting a runner (benchmarks/handoff_server.py); this script is that runner, over the
  real protocol: the spec's launch secret opens its own session (POST /session, as
  runner/connection.py does), then /ready, /commands, /runs/{id}/started, and
  `POST /runner/v1/runs/{id}/metrics` over the server's Unix socket with --batch points
  (default 1,000) per request, beside an empty batch through the same route in the same
  run (the cost of any authenticated request: HTTP, token lookup, one transaction).
- the whole path from `track.log` in a run (the SDK's line, the runner's batch every
  0.5 s, the POST, the stream) to an SSE client, on a `gpulease server` with a real runner
  (local backend, sandboxed), beside a round trip over a local TCP socket.

    .venv/bin/python benchmarks/metrics_ingest.py [-n 30] [--batch 1000] [--ingest-only]

--ingest-only measures the ingest and its empty-batch baseline alone (no SSE delays).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from results import emit
from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine, text
from temp_platform import drop_pg, pg_database

from gpulease.client import GpuleaseClient
from gpulease.client.sse import parse_sse
from gpulease.runner.connection import Connection
from gpulease.schemas.instances import InstanceCreate
from gpulease.schemas.runner import RUNNER_API, RunnerMetricPoint, RunnerMetrics, RunnerSpec
from gpulease.schemas.runs import RunCreate

try:
    from gpulease.runner.metrics import batch_body
except ImportError:  # a tree from before it (PYTHONPATH, timed in turns): its runner sent json=
    batch_body = None

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
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


class HandoffPlatform(Platform):
    """A Platform whose server is benchmarks/handoff_server.py: launches leave their spec in
    spec_dir for this script to play the runner."""

    @property
    def spec_dir(self) -> Path:
        return self.home.parent / "specs"

    def start(self) -> None:
        script = Path(__file__).with_name("handoff_server.py")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), str(self.spec_dir)],
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        for _ in range(300):
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not come up: {self.log_path.read_text()[-3000:]}")

    def runner(self, instance_id: int) -> Connection:
        """The instance's runner, played by the caller: its launch spec's secret opens a
        session of its own and the instance is ready, as runner/connection.py does."""
        spec_file = self.spec_dir / f"{instance_id}.json"
        for _ in range(600):
            if spec_file.exists():
                break
            time.sleep(0.1)
        spec = RunnerSpec.from_json(spec_file.read_text())
        runner = Connection(
            spec.server_url,
            spec.token,
            on_stop=lambda reason: None,
            server_certificate=spec.server_certificate,
            server_socket=spec.server_socket,
        )
        runner.open_session()
        runner.call("POST", f"{RUNNER_API}/ready", json={"pid": os.getpid()})
        return runner


class Bench:
    """One instance whose runner is this script (the spec's launch secret, then a session
    of its own, as runner/connection.py does), with a run that it reports started."""

    def __init__(self, platform: HandoffPlatform) -> None:
        self.platform = platform
        platform.cli(
            "register", "--server", platform.url, "--name", "bench", "--password", "password-123"
        )
        self.user_token = str(json.loads(platform.config.read_text())["token"])
        self.client = GpuleaseClient(platform.url, self.user_token)
        box = self.client.instances.create(
            InstanceCreate(name="box", gpu="T4:1", template="python")
        )
        self.runner = platform.runner(box.id)
        self.run_id = self.client.runs.create("box", RunCreate(command="sleep 3600")).id
        while not self._commanded():
            pass
        started = self.runner.call("POST", f"{RUNNER_API}/runs/{self.run_id}/started", json={})
        assert started.status_code == 204, started.text
        self._alive = threading.Event()
        threading.Thread(target=self._heartbeats, daemon=True).start()
        self.step = 0
        self.client_cpu_ns = 0  # the CPU time of the last post(), in this thread

    def _commanded(self) -> bool:
        r = self.runner.call("GET", f"{RUNNER_API}/commands", params={"wait": 5})
        return any(run["id"] == self.run_id for run in r.json()["runs"])

    def _heartbeats(self) -> None:
        body = {"running_runs": [self.run_id]}
        while not self._alive.wait(1.0):
            self.runner.call("POST", f"{RUNNER_API}/heartbeat", json=body)

    def post(self, count: int) -> float:
        """Seconds for one batch of count new points, from the runner's encoding of its
        points (as runner/metrics.py sends them) to the server's answer."""
        points = [
            RunnerMetricPoint(
                key="loss",
                step=self.step + i,
                value=1.0 / (self.step + i + 1),
                time=T0 + i,
                source="sdk",
            )
            for i in range(count)
        ]
        self.step += count
        path = f"{RUNNER_API}/runs/{self.run_id}/metrics"
        cpu_before = time.thread_time_ns()
        started = time.perf_counter()
        if batch_body is None:
            body = RunnerMetrics(points=points).model_dump(mode="json")
            r = self.runner.call("POST", path, json=body)
        else:
            r = self.runner.call("POST", path, content=batch_body(points))
        elapsed = time.perf_counter() - started
        self.client_cpu_ns = time.thread_time_ns() - cpu_before
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

    def close(self) -> None:
        self._alive.set()
        self.runner.close()
        self.client.close()


def cpu_ns(pids: list[int]) -> int:
    """Nanoseconds on a CPU so far of those processes, all their threads (schedstat; a
    process that is gone counts nothing)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
    return total


def pg_backends(database_url: str) -> list[int]:
    """The pids of the PostgreSQL backends connected to that database now (the server's)."""
    name = database_url.rsplit("/", 1)[1]
    admin = create_engine(PG_ADMIN_URL)
    with admin.connect() as conn:
        rows = conn.execute(
            text("SELECT pid FROM pg_stat_activity WHERE datname = :n"), {"n": name}
        ).all()
    admin.dispose()
    return [int(pid) for (pid,) in rows]


def track_delays(platform: Platform, n: int) -> list[float]:
    """Seconds from `track.log` in a run to its point arriving on an SSE client: the whole
    path (the SDK's line, the runner's batch, the POST, the server, the stream), on an
    instance with a real runner. The run logs its own time.time() as the value; both ends
    read this host's clock."""
    platform.cli(
        "register", "--server", platform.url, "--name", "bench", "--password", "password-123"
    )
    platform.cli(
        "instance", "create", "--gpu", "T4:1", "--template", "python", "--name", "box", "--wait"
    )
    user_token = str(json.loads(platform.config.read_text())["token"])
    script = (
        "import time\nfrom gpulease import track\n"
        f"for i in range({n}):\n"
        "    track.log(step=i, sent=time.time())\n"
        "    time.sleep(0.3)\n"
    )
    with GpuleaseClient(platform.url, user_token) as client:
        run_id = client.runs.create("box", RunCreate(command="python -c " + shlex.quote(script))).id
    samples: list[float] = []
    headers = {"Authorization": f"Bearer {user_token}"}
    params = {"since": "-1:0", "logs": "false"}
    url = f"{platform.url}/api/v1/runs/{run_id}/stream"
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


@contextlib.contextmanager
def started(kind: type[Platform], postgres: bool) -> Iterator[Platform]:
    """A started platform of that kind on a database of its own; stopped and dropped after."""
    pg = pg_database(PG_ADMIN_URL) if postgres else None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        platform = kind(
            home=root / "home",
            database_url=pg[0] if pg else f"sqlite:///{root}/home/gpulease.db",
            port=free_port(),
            simulated="T4:1",
            log_path=root / "server.log",
            config=root / "cli.json",
        )
        platform.start()
        try:
            yield platform
        finally:
            platform.end_runners()
            platform.stop()
            if pg:
                drop_pg(PG_ADMIN_URL, pg[1])


def measure(
    console: Console, label: str, postgres: bool, n: int, batch: int, ingest_only: bool = False
) -> list[tuple[str, list[float]]]:
    with started(HandoffPlatform, postgres) as platform:
        bench = Bench(platform)
        with console.status(f"{label}: ingest"):
            bench.post(batch)  # warm up
            server = [platform.proc.pid] if platform.proc else []
            database = pg_backends(platform.database_url) if postgres else []
            empty, full = [], []
            cpu: dict[str, list[float]] = {"runner": [], "server": [], "PostgreSQL": []}
            for _ in range(n):  # interleaved, so that load on the host falls on both alike
                empty.append(bench.post(0))
                before = cpu_ns(server), cpu_ns(database)
                full.append(bench.post(batch))
                cpu["runner"].append(bench.client_cpu_ns / 1e6)
                cpu["server"].append((cpu_ns(server) - before[0]) / 1e6)
                if postgres:
                    cpu["PostgreSQL"].append((cpu_ns(database) - before[1]) / 1e6)
        # CPU a batch, where the time goes whatever the host's load (medians; the server's
        # includes its reconcilers' ticks, PostgreSQL's every backend of the database)
        spent = ", ".join(f"{who} {statistics.median(ms):.2f}" for who, ms in cpu.items() if ms)
        console.print(f"{label}: CPU ms a batch of {batch}, medians: {spent}", soft_wrap=True)
        if ingest_only:
            bench.close()
            return [
                (f"{label}: empty batch request (baseline)", empty),
                (f"{label}: batch of {batch} points", full),
            ]
        with console.status(f"{label}: delay to an SSE client"):
            delays = bench.delays(n)
        bench.close()
    with (
        console.status(f"{label}: delay from track.log in a run to an SSE client"),
        started(Platform, postgres) as platform,
    ):
        tracked = track_delays(platform, n)
    return [
        (f"{label}: empty batch request (baseline)", empty),
        (f"{label}: batch of {batch} points", full),
        (f"{label}: point POSTed → SSE event", delays),
        (f"{label}: track.log in a run → SSE event", tracked),
    ]


TARGET_POINTS_S = 100_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--ingest-only", action="store_true")
    args = parser.parse_args()
    console = Console()
    rows = measure(console, "SQLite", False, args.n, args.batch, args.ingest_only)
    if pg_database(PG_ADMIN_URL, probe=True) is None:
        console.print(f"[dim]PostgreSQL not reachable at {PG_ADMIN_URL}: SQLite only[/dim]")
    else:
        rows += measure(console, "PostgreSQL", True, args.n, args.batch, args.ingest_only)
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
    for label, samples in rows:
        med = statistics.median(samples)
        p90 = statistics.quantiles(samples, n=10)[-1] if len(samples) > 1 else med
        if "baseline" in label:
            base_empty = med
            table.add_row(label, f"{med * 1000:.2f}", f"{p90 * 1000:.2f}", "", "1.0")
        elif "points" in label:
            rate = args.batch / med
            ratio = med / base_empty
            table.add_row(
                label, f"{med * 1000:.2f}", f"{p90 * 1000:.2f}", f"{rate:,.0f}", f"{ratio:.1f}"
            )
            emit(
                f"metric ingest, batches of {args.batch:,} ({label.split(':')[0]})",
                f"{rate:,.0f} points/s ({med * 1000:.1f} ms a batch)",
                f"empty request {base_empty * 1000:.1f} ms",
                f"{ratio:.1f}× the empty request",
                f">= {TARGET_POINTS_S:,} points/s",
                rate >= TARGET_POINTS_S,
            )
        else:
            ratio = med / base_socket
            table.add_row(label, f"{med * 1000:.2f}", f"{p90 * 1000:.2f}", "", f"{ratio:.0f}")
            emit(
                label,
                f"{med * 1000:.1f} ms",
                f"TCP round trip {base_socket * 1000:.3f} ms",
                f"{ratio:,.0f}×",
                "",
                None,
            )
    console.print(table)


if __name__ == "__main__":
    main()
