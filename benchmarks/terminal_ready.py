"""Terminal and JupyterLab readiness: from `gpulease instance start` to a usable terminal
prompt, and to a JupyterLab that answers, beside the bare start of a Python process.

Against a real server, CLI and runner on this host (SQLite, the local backend, the `python`
template and the JupyterLab tools environment already built, the sandbox when bubblewrap
works). Each round starts the stopped instance with the CLI and, at the same time, keeps
trying (every 20 ms) to open the terminal WebSocket and to open JupyterLab as the console
does (the owner's "Open JupyterLab", then the one-use ticket on JupyterLab's own origin):
the terminal counts as ready at the first prompt bytes through its WebSocket, JupyterLab at
the first 200 of its `/api/status` on its origin. Then the instance is stopped again.
`python -c pass` is timed in the same run. Medians of N (default 5).

    .venv/bin/python benchmarks/terminal_ready.py [-n 5]
"""

from __future__ import annotations

import argparse
import html
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from websockets.exceptions import InvalidStatus, WebSocketException
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from results import emit
from temp_platform import byte_compile, sqlite_platform

from gpulease.runner.sandbox import probe  # noqa: E402
from gpulease.server.routers.ui.jupyter_proxy import JUPYTER_COOKIE  # noqa: E402
from processes import BIN, Platform  # noqa: E402

PASSWORD = "password-123"
ENTRY = re.compile(r'href="([^"]+)" data-testid="jupyterlab-link"')
POLL_S = 0.02
LIMIT_S = 300.0


def status(platform: Platform) -> str:
    return str(platform.cli_json("instance", "show", "box")["status"])  # type: ignore[index]


def wait_for(platform: Platform, wanted: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while (now := status(platform)) != wanted:
        if time.monotonic() > deadline or now == "failed":
            raise RuntimeError(f"instance is {now}, waited for {wanted}")
        time.sleep(0.2)


def terminal_ready(url: str, cookie: str, origin: str) -> float:
    """Seconds until the terminal WebSocket delivers its first bytes (the prompt)."""
    started = time.perf_counter()
    while time.perf_counter() - started < LIMIT_S:
        try:
            with connect(
                url,
                additional_headers={"Cookie": cookie, "Origin": origin},
                open_timeout=10,
                proxy=None,
            ) as ws:
                while True:
                    message = ws.recv(timeout=30)
                    if isinstance(message, bytes) and message:
                        return time.perf_counter() - started
                    break  # an error message: not running yet
        except (InvalidStatus, WebSocketException, OSError, TimeoutError):
            pass
        time.sleep(POLL_S)
    raise RuntimeError("the terminal never became ready")


def jupyter_ready(base: str, instance_id: int, cookie: str) -> float:
    """Seconds until this instance's JupyterLab answers on its own origin, as the console
    opens it: the owner's "Open JupyterLab" POST (which waits for JupyterLab to answer),
    its one-use ticket redeemed on the Jupyter host for that host's cookie, then a 200
    from `/api/status` there. The Jupyter host is reached on the server's address with
    its name in the Host header (`*.jupyter.localhost` need not resolve here)."""
    started = time.perf_counter()
    with httpx.Client(timeout=LIMIT_S) as client:
        while time.perf_counter() - started < LIMIT_S:
            try:
                opened = client.post(
                    f"{base}/instances/{instance_id}/jupyterlab",
                    headers={"Cookie": cookie, "Origin": base},
                )
                found = ENTRY.search(opened.text) if opened.status_code == 200 else None
                if found is not None:
                    entry = urlsplit(html.unescape(found.group(1)))
                    host = {"Host": entry.netloc}
                    entered = client.get(f"{base}{entry.path}?{entry.query}", headers=host)
                    lab_cookie = entered.cookies.get(JUPYTER_COOKIE)
                    status = client.get(
                        f"{base}/instances/{instance_id}/jupyter/api/status",
                        headers={**host, "Cookie": f"{JUPYTER_COOKIE}={lab_cookie}"},
                    )
                    if status.status_code == 200:
                        return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            time.sleep(POLL_S)
    raise RuntimeError("JupyterLab never became ready")


def one_round(platform: Platform, instance_id: int, cookie: str) -> tuple[float, float, float]:
    """(CLI start returned, terminal ready, JupyterLab ready), seconds from the start."""
    base = platform.url
    ws_url = base.replace("http", "ws", 1) + f"/instances/{instance_id}/terminal/ws"
    results: dict[str, float] = {}

    def measure(name: str, probe_once: object) -> None:
        results[name] = probe_once()  # type: ignore[operator]

    threads = [
        threading.Thread(
            target=measure, args=("terminal", lambda: terminal_ready(ws_url, cookie, base))
        ),
        threading.Thread(
            target=measure,
            args=(
                "jupyter",
                lambda: jupyter_ready(base, instance_id, cookie),
            ),
        ),
    ]
    started = time.perf_counter()
    command = subprocess.Popen(
        [str(BIN / "gpulease"), "instance", "start", "box"],
        env=platform.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for thread in threads:
        thread.start()
    command.wait(120)
    cli = time.perf_counter() - started
    for thread in threads:
        thread.join(LIMIT_S + 10)
    platform.cli("instance", "stop", "box")
    wait_for(platform, "stopped")
    return cli, results["terminal"], results["jupyter"]


def python_pass() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=5)
    args = parser.parse_args()
    byte_compile()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        platform = sqlite_platform(root, "T4:1")
        sandboxed = probe() is None
        if not sandboxed:
            platform.extra_env["GPULEASE_UNSANDBOXED_SINGLE_USER"] = "true"
        platform.start()
        try:
            platform.cli(
                "register", "--server", platform.url, "--name", "bench", "--password", PASSWORD
            )
            print("creating the instance (builds the python template once) ...", flush=True)
            platform.cli(
                "instance",
                "create",
                "--gpu",
                "T4:1",
                "--template",
                "python",
                "--name",
                "box",
                "--wait",
            )
            instance_id = int(platform.cli_json("instance", "show", "box")["id"])  # type: ignore[index]
            login = httpx.post(
                f"{platform.url}/api/v1/auth/login", json={"name": "bench", "password": PASSWORD}
            )
            cookie = f"gpulease_session={login.json()['token']}"
            print("installing JupyterLab into the environment cache (once) ...", flush=True)
            jupyter_ready(platform.url, instance_id, cookie)
            platform.cli("instance", "stop", "box")
            wait_for(platform, "stopped")
            rounds = []
            for i in range(args.n):
                rounds.append(one_round(platform, instance_id, cookie))
                print(
                    f"round {i + 1}/{args.n}: " + ", ".join(f"{x:.2f} s" for x in rounds[-1]),
                    flush=True,
                )
            bare = [python_pass() for _ in range(args.n)]
        finally:
            platform.end_runners()
            platform.stop()

    def median(values: list[float]) -> float:
        return statistics.median(values)

    base = median(bare)
    print(
        f"\nterminal and JupyterLab readiness, median of {args.n} "
        f"(this host, SQLite, local backend, {'sandboxed' if sandboxed else 'no sandbox'})"
    )
    print(f"{'what':44} {'median s':>9} {'× python -c pass':>17}")
    rows = [
        ("python -c pass", bare),
        ("`instance start` CLI returns", [r[0] for r in rounds]),
        ("start → terminal prompt (WebSocket bytes)", [r[1] for r in rounds]),
        ("start → JupyterLab opened on its origin", [r[2] for r in rounds]),
    ]
    for label, samples in rows:
        print(f"{label:44} {median(samples):9.2f} {median(samples) / base:17.1f}")
        if samples is not bare:
            emit(
                label,
                f"{median(samples):.2f} s",
                f"python -c pass {base:.3f} s",
                f"{median(samples) / base:.1f}×",
                "",
                None,
            )


if __name__ == "__main__":
    main()
