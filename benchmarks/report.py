"""Run every benchmark and write one Markdown table of their figures (`make bench`).

Each benchmark runs as its own process, its output passed through as it comes; the
`bench-result` lines it prints (benchmarks/results.py) become the table's rows:
figure | measured | baseline (same run) | ratio | target. A benchmark that fails or
prints no result line gets a row saying so, and the report goes on.

    .venv/bin/python benchmarks/report.py [--out bench-report.md] [NAME ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from results import parse

HERE = Path(__file__).resolve().parent
BENCHMARKS = (
    "launch_latency",
    "dataset_push",
    "billing_tick",
    "metrics_ingest",
    "terminal_ready",
    "stop_latency",
    "runner_overhead",
    "scheduler_tick",
    "auth_limits",
    "request_overhead",
    "ray_launch_latency",
)


def run(name: str) -> tuple[list[dict[str, Any]], int]:
    """The benchmark's result lines and its exit status, its output echoed meanwhile."""
    found: list[dict[str, Any]] = []
    with subprocess.Popen(
        [sys.executable, str(HERE / f"{name}.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=HERE.parent,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            result = parse(line)
            if result is not None:
                found.append(result)
    return found, proc.returncode


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    lines = [
        "| benchmark | figure | measured | baseline (same run) | ratio | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in rows:
        met = {True: "yes", False: "**no**", None: ""}[r.get("met")]
        fields = (name, r["figure"], r["value"], r["baseline"], r["ratio"], r["target"], met)
        lines.append("| " + " | ".join(cell(f) for f in fields) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help=f"default: all of {', '.join(BENCHMARKS)}")
    parser.add_argument("--out", type=Path, default=Path("bench-report.md"))
    args = parser.parse_args()
    unknown = set(args.names) - set(BENCHMARKS)
    if unknown:
        parser.error(f"no benchmark named {', '.join(sorted(unknown))}; pick from {BENCHMARKS}")
    rows: list[tuple[str, dict[str, Any]]] = []
    for name in args.names or BENCHMARKS:
        print(f"== {name}", flush=True)
        found, status = run(name)
        rows += [(name, r) for r in found]
        if status != 0 or not found:
            why = f"exited {status}" if status != 0 else "printed no bench-result line"
            gap = {"figure": f"({why}; see its output above)", "value": "", "baseline": ""}
            rows.append((name, gap | {"ratio": "", "target": "", "met": None}))
    report = table(rows)
    args.out.write_text(report)
    print(f"\n{report}\nwritten to {args.out}")


if __name__ == "__main__":
    main()
