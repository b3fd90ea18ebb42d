"""Launch latency: `gpulease exec` and `gpulease run` to the command's first output line,
and `gpulease --help`, each beside its baseline measured in the same run.

Against a real server, CLI and runner on this host (SQLite, the local backend, the `python`
template, already built; the sandbox when bubblewrap works here):

- `gpulease exec box -- echo hi` on a running instance → its `hi`, beside
  `python -c "print(1)"` timed the same way: the cost of starting any Python program here.
- `gpulease run --gpu A100-80GB:1 -- echo hi` on an idle node (a new instance each time) →
  its `hi`, beside Ray's `ray job submit -- echo hi` to a local Ray head (started here on
  loopback with free ports, dashboard included) → its `hi`, taken in turns.
- `gpulease --help` to its exit, beside `python -c pass`.
- `gpulease instance ls` (a command of one resource group: its modules, the client, one
  request, a table) to its exit, beside `python -c pass`. No target: it says what every
  plain command costs.

Medians of N (default 20; `--run-n`, default 10, for the two runs). gpulease's modules are
compiled to bytecode first, as installing the package does.

    .venv/bin/python benchmarks/launch_latency.py [-n 20] [--run-n 10] [--no-ray]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from results import emit
from temp_platform import byte_compile, sqlite_platform

from gpulease.runner.sandbox import probe  # noqa: E402
from processes import BIN, Platform, free_port  # noqa: E402
from ray_support import kill_processes_under  # noqa: E402

EXEC_TARGET = 15.0  # × python -c print
HELP_TARGET = 10.0  # × python -c pass
RUN_TARGET = 0.25  # × ray job submit
RAY_START_S = 300.0


def line_seconds(argv: list[str], env: dict[str, str] | None = None, wanted: str = "") -> float:
    """Seconds from starting argv to the first stdout line equal to wanted (any line when
    wanted is empty); the process then finishes."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if not wanted or line.rstrip("\n") == wanted:
            elapsed = time.perf_counter() - started
            proc.communicate(timeout=120)
            return elapsed
    proc.wait(120)
    raise RuntimeError(f"{argv} never printed {wanted or 'a line'} (exit {proc.returncode})")


def exit_seconds(argv: list[str], env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def wait_free(platform: Platform, model: str) -> None:
    while True:
        gpus = {g["name"]: g for g in platform.cli_json("gpus")}  # type: ignore[union-attr]
        if gpus[model]["free"] == gpus[model]["total"]:
            return
        time.sleep(0.1)


@contextmanager
def ray_head(root: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A Ray head on loopback (`ray start --head --block`, every port a free one, files
    under root); yields the job submission address and the environment to reach it. On the
    way out its processes are stopped: the `ray start` by its pid, then whatever else
    names root."""
    ray = shutil.which("ray", path=str(BIN))
    if ray is None:
        raise RuntimeError("Ray is not installed: pip install 'gpulease[ray]'")
    env = {**os.environ, "RAY_TMPDIR": str(root / "tmp"), "RAY_USAGE_STATS_ENABLED": "0"}
    (root / "tmp").mkdir(parents=True)
    low = free_port()
    workers = range(low, low + 201)

    def other_port() -> int:
        """A free port outside the workers' range (Ray refuses to start on an overlap)."""
        while (port := free_port()) in workers:
            pass
        return port

    dashboard = other_port()
    ports = {
        "--port": other_port(),
        "--dashboard-port": dashboard,
        "--dashboard-agent-listen-port": other_port(),
        "--dashboard-agent-grpc-port": other_port(),
        "--metrics-export-port": other_port(),
        "--runtime-env-agent-port": other_port(),
        "--ray-client-server-port": other_port(),
        "--node-manager-port": other_port(),
        "--object-manager-port": other_port(),
    }
    argv = [ray, "start", "--head", "--block", "--node-ip-address", "127.0.0.1"]
    argv += ["--dashboard-host", "127.0.0.1", "--include-dashboard", "true", "--num-cpus", "1"]
    argv += ["--temp-dir", str(root / "tmp"), "--disable-usage-stats"]
    argv += ["--min-worker-port", str(low), "--max-worker-port", str(low + 200)]
    for option, port in ports.items():
        argv += [option, str(port)]
    with (root / "ray.log").open("w") as log:
        head = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + RAY_START_S
        while True:  # until a job runs: the dashboard's job agent comes up last
            probe_job = subprocess.run(
                [ray, "job", "submit", "--address", address, "--", "true"],
                env=env,
                capture_output=True,
                text=True,
            )
            if probe_job.returncode == 0:
                break
            if head.poll() is not None or time.monotonic() > deadline:
                log_tail = (root / "ray.log").read_text()[-2000:]
                raise RuntimeError(f"the Ray head did not take jobs:\n{log_tail}")
            time.sleep(1)
        yield address, env
    finally:
        head.terminate()
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            head.kill()
        kill_processes_under(root)


def measure(progress: Progress, label: str, n: int, once: Callable[[], float]) -> list[float]:
    task = progress.add_task(label, total=n)
    samples = []
    for _ in range(n):
        samples.append(once())
        progress.advance(task)
    return samples


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("--run-n", type=int, default=10)
    parser.add_argument("--no-ray", action="store_true", help="leave Ray's baseline out")
    args = parser.parse_args()
    console = Console()
    byte_compile()
    gl = str(BIN / "gpulease")
    run_argv = [gl, "run", "--gpu", "A100-80GB:1", "--template", "python", "--", "echo hi"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        extra = {} if probe() is None else {"GPULEASE_UNSANDBOXED_SINGLE_USER": "true"}
        platform = sqlite_platform(root, "T4:1,A100-80GB:1", extra)
        platform.start()
        try:
            platform.cli(
                "register", "--server", platform.url, "--name", "bench", "--password", "pw-123456"
            )
            with console.status("building the python template (once)"):
                platform.cli(
                    "instance", "create", "--gpu", "T4:1", "--template", "python",
                    "--name", "box", "--wait",
                )  # fmt: skip
            env = platform.env()
            with Progress(console=console) as progress:
                prints = measure(
                    progress,
                    "python -c print(1)",
                    args.n,
                    lambda: line_seconds([sys.executable, "-c", "print(1)"]),
                )
                execs = measure(
                    progress,
                    "gpulease exec",
                    args.n,
                    lambda: line_seconds([gl, "exec", "box", "--", "echo hi"], env, "hi"),
                )
                passes = measure(
                    progress,
                    "python -c pass",
                    args.n,
                    lambda: exit_seconds([sys.executable, "-c", "pass"]),
                )
                helps = measure(
                    progress, "gpulease --help", args.n, lambda: exit_seconds([gl, "--help"], env)
                )
                lists = measure(
                    progress,
                    "gpulease instance ls",
                    args.n,
                    lambda: exit_seconds([gl, "instance", "ls"], env),
                )

                def one_run() -> float:
                    wait_free(platform, "A100-80GB")
                    return line_seconds(run_argv, env, "hi")

                if args.no_ray:
                    runs = measure(progress, "gpulease run", args.run_n, one_run)
                    rays: list[float] = []
                else:
                    with ray_head(root / "ray") as (address, ray_env):
                        ray = [str(BIN / "ray"), "job", "submit", "--address", address]
                        runs, rays = [], []
                        task = progress.add_task("gpulease run / ray job submit", total=args.run_n)
                        for _ in range(args.run_n):  # in turns: both see the same load
                            runs.append(one_run())
                            rays.append(line_seconds([*ray, "--", "echo", "hi"], ray_env, "hi"))
                            progress.advance(task)
        finally:
            platform.end_runners()
            platform.stop()

    table = Table(title=f"launch latency, medians (this host, SQLite, local backend, n={args.n})")
    for col in ("what", "median s", "baseline s", "ratio", "target"):
        table.add_column(col, justify="left" if col == "what" else "right")
    rows = [
        ("gpulease exec, running instance → first output line", execs, "python -c print", prints,
         EXEC_TARGET, "×"),
        ("gpulease --help", helps, "python -c pass", passes, HELP_TARGET, "×"),
        ("gpulease instance ls", lists, "python -c pass", passes, None, "×"),
    ]  # fmt: skip
    if rays:
        rows.append(
            ("gpulease run, idle node → first output line", runs, "ray job submit", rays,
             RUN_TARGET, "× Ray's")
        )  # fmt: skip
    for figure, samples, base_label, base, target, unit in rows:
        ratio = median(samples) / median(base)
        wanted = "" if target is None else f"<= {target:g}{unit}"
        table.add_row(
            figure, f"{median(samples):.3f}", f"{median(base):.3f}", f"{ratio:.2f}", wanted
        )
        emit(
            figure,
            f"{median(samples):.3f} s",
            f"{base_label} {median(base):.3f} s",
            f"{ratio:.2f}{unit}",
            wanted,
            None if target is None else ratio <= target,
        )
    if not rays:
        run = median(runs)
        table.add_row("gpulease run, idle node → first output line", f"{run:.3f}", "", "", "")
        emit("gpulease run, idle node → first output line", f"{run:.3f} s", "", "", "", None)
    console.print(table)


if __name__ == "__main__":
    main()
