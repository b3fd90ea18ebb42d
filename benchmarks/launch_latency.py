"""Launch latency: from `gpulease exec` / `gpulease run` to the command's first output line.

Measured against a real server, CLI and runner on this host (SQLite, the local backend, the
`python` template, already built), beside `python -c "print(1)"` timed the same way in the
same run: the cost of starting any Python program here. Medians of N (default 20).

    .venv/bin/python benchmarks/launch_latency.py [-n 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from results import emit

from processes import BIN, Platform, free_port  # noqa: E402

TARGETS = {"gpulease exec, running instance": 15.0}


def first_line_seconds(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Seconds from starting argv to its first line on stdout; the process then finishes."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - started
    proc.communicate(timeout=120)
    if not line:
        raise RuntimeError(f"{argv} printed nothing (exit {proc.returncode})")
    return elapsed


def wait_free(platform: Platform, model: str) -> None:
    while True:
        gpus = {g["name"]: g for g in platform.cli_json("gpus")}  # type: ignore[union-attr]
        if gpus[model]["free"] == gpus[model]["total"]:
            return
        time.sleep(0.1)


def measure(progress: Progress, label: str, n: int, once: Callable[[], float]) -> list[float]:
    task = progress.add_task(label, total=n)
    samples = []
    for _ in range(n):
        samples.append(once())
        progress.advance(task)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=20)
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        platform = Platform(
            home=root / "home",
            database_url=f"sqlite:///{root / 'home' / 'gpulease.db'}",
            port=free_port(),
            simulated="T4:1,A100-80GB:1",
            log_path=root / "server.log",
            config=root / "cli.json",
        )
        platform.start()
        try:
            platform.cli(
                "register",
                "--server",
                platform.url,
                "--name",
                "bench",
                "--password",
                "password-123",
            )
            with console.status("building the python template (once)"):
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
            env = platform.env()
            gl = str(BIN / "gpulease")
            with Progress(console=console) as progress:
                baseline = measure(
                    progress,
                    "python -c print(1)",
                    args.n,
                    lambda: first_line_seconds([sys.executable, "-c", "print(1)"]),
                )
                exec_s = measure(
                    progress,
                    "gpulease exec",
                    args.n,
                    lambda: first_line_seconds([gl, "exec", "box", "--", "echo hi"], env),
                )

                def one_run() -> float:
                    wait_free(platform, "A100-80GB")
                    return first_line_seconds(
                        [
                            gl,
                            "run",
                            "--gpu",
                            "A100-80GB:1",
                            "--template",
                            "python",
                            "--",
                            "echo hi",
                        ],
                        env,
                    )

                run_s = measure(progress, "gpulease run", args.n, one_run)
        finally:
            platform.end_runners()
            platform.stop()

    base = statistics.median(baseline)
    table = Table(title=f"launch latency, median of {args.n} (this host, SQLite, local backend)")
    for col in ("what", "median s", "p90 s", "× baseline"):
        table.add_column(col, justify="right" if col != "what" else "left")
    for label, samples in (
        ('python -c "print(1)"  (baseline)', baseline),
        ("gpulease exec, running instance", exec_s),
        ("gpulease run, idle node", run_s),
    ):
        med = statistics.median(samples)
        p90 = statistics.quantiles(samples, n=10)[-1] if len(samples) > 1 else med
        table.add_row(label, f"{med:.3f}", f"{p90:.3f}", f"{med / base:.1f}")
        if samples is not baseline:
            target = TARGETS.get(label)
            emit(
                f"{label} → first output line",
                f"{med:.3f} s",
                f"python -c print {base:.3f} s",
                f"{med / base:.1f}×",
                f"<= {target:.0f}×" if target else "",
                med / base <= target if target else None,
            )
    console.print(table)


if __name__ == "__main__":
    main()
