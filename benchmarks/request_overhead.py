"""What one request costs the server: its CPU milliseconds for `GET /healthz` with a token,
for an authenticated `GET /api/v1/datasets`, and for a runner's `GET /runner/v1/commands`
that finds nothing to do (the long poll's immediate answer, with the runner's own session
token), beside a bare Starlette app with one route served by the same uvicorn, in turns, in
the same run. Every runner heartbeat, log batch and metric batch, and every CLI call, pays
this; on a two-core node it is CPU the training job does not get.

The gpulease server is benchmarks/handoff_server.py (the real server; its backend leaves
each launch's spec for this script, which opens the runner's session as a runner does).

Each figure is the median of several turns of --requests requests over one kept-alive
connection; the server's CPU comes from /proc (user and system), less what it burns idle
over the same wall time (its reconcilers tick), measured just before.

With --against DIR a second gpulease server runs with DIR first on its PYTHONPATH, in the
same turns: older code (`git archive REV src | tar -x -C OLD`, then `--against OLD/src`) or
another FastAPI (`pip install --no-deps --target DIR fastapi==X`).

    .venv/bin/python benchmarks/request_overhead.py [--requests 300] [--turns 5] [--against DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import temp_platform  # noqa: E402
from metrics_ingest import HandoffPlatform  # noqa: E402
from results import emit  # noqa: E402

from gpulease.schemas.runner import RUNNER_API  # noqa: E402
from processes import free_port  # noqa: E402

COMMANDS = f"{RUNNER_API}/commands?wait=0"

BARE_APP = """
import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

async def ok(request):
    return JSONResponse({"status": "ok"})

app = Starlette(routes=[Route("/healthz", ok)])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


def process_cpu(pid: int) -> float:
    """CPU seconds (user and system) process pid has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Target:
    """A server to send requests to: its process, base URL, the user's token and the
    runner's (None: none)."""

    def __init__(
        self, name: str, pid: int, url: str, token: str | None, runner_token: str | None = None
    ) -> None:
        self.name, self.pid, self.url = name, pid, url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=url, headers=headers, timeout=30)
        runner = {"Authorization": f"Bearer {runner_token}"} if runner_token else {}
        self.runner_client = httpx.Client(base_url=url, headers=runner, timeout=30)

    def idle_rate(self, seconds: float = 1.0) -> float:
        before = process_cpu(self.pid)
        time.sleep(seconds)
        return (process_cpu(self.pid) - before) / seconds

    def cpu_ms_per_request(self, path: str, requests: int) -> float:
        idle = self.idle_rate()
        before, started = process_cpu(self.pid), time.perf_counter()
        client = self.runner_client if path.startswith(RUNNER_API) else self.client
        for _ in range(requests):
            answer = client.get(path)
            assert answer.status_code == 200, (path, answer.status_code, answer.text[:200])
        wall = time.perf_counter() - started
        used = process_cpu(self.pid) - before - idle * wall
        return used / requests * 1000


@contextlib.contextmanager
def gpulease_server(root: Path, name: str, pythonpath: str | None) -> Iterator[Target]:
    root = root / name
    root.mkdir()
    extra = {"XDG_CACHE_HOME": str(root / "cache")}
    if pythonpath is not None:
        extra["PYTHONPATH"] = pythonpath
    platform = temp_platform.sqlite_platform(root, "T4:1", extra, kind=HandoffPlatform)
    assert isinstance(platform, HandoffPlatform)
    platform.start()
    try:
        platform.cli(
            "register", "--server", platform.url, "--name", "bench", "--password", "password-123"
        )
        token = json.loads((root / "cli.json").read_text())["token"]
        box = platform.cli_json(
            "instance", "create", "--name", "box", "--gpu", "T4:1", "--template", "python"
        )
        assert isinstance(box, dict)
        runner = platform.runner(int(box["id"]))
        done = threading.Event()

        def heartbeats() -> None:  # as a runner's own thread does: the instance stays alive
            while not done.wait(1.0):
                runner.call("POST", f"{RUNNER_API}/heartbeat", json={"running_runs": []})

        beating = threading.Thread(target=heartbeats, daemon=True)
        with contextlib.closing(runner):
            beating.start()
            assert platform.proc is not None
            try:
                yield Target(name, platform.proc.pid, platform.url, token, runner.token)
            finally:
                done.set()
                beating.join()
    finally:
        platform.end_runners()
        platform.stop()


@contextlib.contextmanager
def bare_server() -> Iterator[Target]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", BARE_APP, str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the bare app did not start")
            time.sleep(0.1)
        yield Target("bare Starlette", proc.pid, url, None)
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300, help="requests a turn")
    parser.add_argument("--turns", type=int, default=5, help="turns (the figure is the median)")
    parser.add_argument("--against", metavar="DIR", help="also a server with DIR on PYTHONPATH")
    args = parser.parse_args()
    paths = ("/healthz", "/api/v1/datasets", COMMANDS)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        servers = [stack.enter_context(gpulease_server(root, "gpulease", None))]
        if args.against:
            servers.append(
                stack.enter_context(gpulease_server(root, "against", str(Path(args.against))))
            )
        bare = stack.enter_context(bare_server())
        figures: dict[tuple[str, str], list[float]] = {}
        for turn in range(args.turns):
            order = [*servers, bare]
            for target in order[:: 1 if turn % 2 == 0 else -1]:
                for path in paths if target is not bare else paths[:1]:
                    figure = target.cpu_ms_per_request(path, args.requests)
                    figures.setdefault((target.name, path), []).append(figure)
            print(
                f"turn {turn + 1}: "
                + ", ".join(
                    f"{name} {path} {ms[-1]:.2f} ms" for (name, path), ms in figures.items()
                )
            )
    baseline = statistics.median(figures[("bare Starlette", "/healthz")])
    for target in servers:
        for path in paths:
            value = statistics.median(figures[(target.name, path)])
            label = "" if target.name == "gpulease" else f" ({target.name}: {args.against})"
            emit(
                f"server CPU per request, GET {path}{label}",
                f"{value:.2f} ms",
                f"bare Starlette GET /healthz {baseline:.2f} ms",
                f"{value / baseline:.1f}×",
                "",
                None,
            )


if __name__ == "__main__":
    main()
