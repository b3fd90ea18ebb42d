"""A Ray head whose GCS restarts with its tables in Redis (GCS fault tolerance), under a run.

A local Ray cluster on loopback (a head whose GCS keeps its tables in the Redis at --redis,
under a namespace of its own, and node gpu-r with 2 simulated A100-80GB) and a real server
on the Ray backend. One job prints a numbered line every 0.2 s through `gpulease run`; N
times (default 3) the head's GCS is SIGKILLed and started again DOWN seconds later (default
2). Measured:

- GCS started again → a new `gpulease run -- echo hi` prints its line (a runner actor
  created through the new GCS), beside the same run before any restart, in this run;
- the job's lines lost or repeated over all the restarts (target 0), and whether the job's
  runner is still the process it was (its shell's pid, printed first);
- the job's one usage segment billed for all of its seconds, once.

Medians of N.

    .venv/bin/python benchmarks/ray_head_restart.py [-n 3] [--down 2] [--redis 127.0.0.1:6379]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from results import emit  # noqa: E402

from gpulease.core.money import cost_for_seconds  # noqa: E402
from processes import Platform  # noqa: E402
from ray_support import local_ray_cluster, running_ray_platform  # noqa: E402

TICK_S = 0.2
RUN = ("run", "--gpu", "A100-80GB:1", "--template", "python")


def echo_seconds(platform: Platform, stderr: Path) -> float:
    """`gpulease run -- echo hi` started → its line printed."""
    started = time.monotonic()
    run = platform.popen_cli(*RUN, "--", "echo hi", stderr_path=stderr)
    assert run.stdout is not None
    with run.stdout:
        line = run.stdout.readline()
        took = time.monotonic() - started
    if line.strip() != "hi" or run.wait(120) != 0:
        raise RuntimeError(f"the run printed {line!r}: {stderr.read_text()[-2000:]}")
    return took


def wait_one_free(platform: Platform) -> None:
    """Until the job's instance is the only one holding an A100 (the last echo released)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        gpus: Any = {g["name"]: g for g in platform.cli_json("gpus")}  # type: ignore[union-attr]
        if gpus["A100-80GB"]["free"] == gpus["A100-80GB"]["total"] - 1:
            return
        time.sleep(0.2)
    raise RuntimeError("the echo run's instance was not released")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=3)
    parser.add_argument("--down", type=float, default=2.0, help="seconds the GCS stays down")
    parser.add_argument("--redis", default="127.0.0.1:6379")
    args = parser.parse_args()
    console = Console()
    ticks = int((args.n * (args.down + 15) + 10) / TICK_S)
    script = (
        f"echo pid $$; i=0; while [ $i -lt {ticks} ]; do i=$((i+1)); echo tick $i;"
        f" sleep {TICK_S}; done"
    )
    with (
        tempfile.TemporaryDirectory() as tmp,
        local_ray_cluster(workers=("gpu-r",), redis=args.redis) as cluster,
        running_ray_platform(cluster, Path(tmp), f"sqlite:///{tmp}/gpulease.db") as platform,
    ):
        root = Path(tmp)
        platform.cli(
            "register", "--server", platform.url, "--name", "bench", "--password", "bench-pass-1"
        )
        echo_seconds(platform, root / "echo.err")  # builds the template's environment
        before = [echo_seconds(platform, root / "echo.err") for _ in range(args.n)]
        job = platform.popen_cli(*RUN, "--", script, stderr_path=root / "job.err")
        assert job.stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(job.stdout or []), daemon=True)
        reader.start()
        while not any(x.startswith("tick") for x in lines):
            time.sleep(0.05)
        after = []
        for _ in range(args.n):
            cluster.restart_gcs(down_s=args.down)
            wait_one_free(platform)
            after.append(echo_seconds(platform, root / "echo.err"))
        code = job.wait(ticks * TICK_S * 3 + 60)
        reader.join(10)
        usage: Any = platform.cli_json("usage")
    said = [line.strip() for line in lines]
    got = [int(x.split()[1]) for x in said if x.startswith("tick ")]
    lost = len(set(range(1, ticks + 1)) - set(got))
    repeated = len(got) - len(set(got))
    pids = [x for x in said if x.startswith("pid ")]
    (segment,) = [s for s in usage["segments"] if s["billed_seconds"] >= ticks * TICK_S]
    billed_once = segment["charged_micro"] == cost_for_seconds(
        segment["hourly_micro"], segment["billed_seconds"]
    )
    table = Table(title=f"Ray head (GCS) restarts under a run, {args.n} × {args.down:g} s down")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row(
        "run → first line, before any restart (median s)", f"{statistics.median(before):.2f}"
    )
    table.add_row(
        "a run started once the GCS is back → first line (median s)",
        f"{statistics.median(after):.2f}",
    )
    table.add_row("the job's exit code", str(code))
    table.add_row("its lines lost / repeated", f"{lost} / {repeated}")
    table.add_row("its shell started", f"{len(pids)} time(s)")
    table.add_row(
        "its segment: billed s (job ran s)", f"{segment['billed_seconds']} ({ticks * TICK_S:.0f}+)"
    )
    table.add_row("charged = billed seconds' price", str(billed_once))
    console.print(table)
    emit(
        "Ray GCS restart (Redis) → a new `gpulease run` prints its line",
        f"{statistics.median(after):.2f} s",
        f"before any restart {statistics.median(before):.2f} s",
        f"{statistics.median(after) / statistics.median(before):.1f}×",
        "",
        None,
    )
    emit(
        f"a job's lines lost over {args.n} GCS restarts",
        f"{lost} lost, {repeated} repeated, shell started {len(pids)}×",
        f"{ticks} lines",
        "",
        "0 lost, one shell",
        lost == 0 and repeated == 0 and len(pids) == 1 and code == 0 and billed_once,
    )


if __name__ == "__main__":
    main()
