"""Materialising a dataset version on a node, beside `tar xf` of the same tree.

The node side of benchmarks/dataset_push.py on its own, run in turns so that every figure
sees the same load: a tree of generated files of about 10 KB is pushed once to an in-process
server (SQLite, local blob store, sealed chunks), then each run extracts a tar of the tree
into an empty directory and materialises the version into an empty node cache with the
runner's materialise() (runner/datasets.py: manifest, chunk packs, decrypting and checking
every chunk, writing the tree read-only), each step first in some runs. As in
dataset_push.py the runner talks to the app on its ASGI transport, in the same process.
Medians of --runs. --against F times another copy of runner/datasets.py in the same turns
(the code before a change: `git show REV:src/gpulease/runner/datasets.py > F`). With
--profile FILE one more materialise runs under cProfile, its statistics written to FILE
(`python -m pstats FILE`); with --spy FILE py-spy samples every thread of one more
materialise while it holds the GIL (the in-process server's included), raw format.

    .venv/bin/python benchmarks/dataset_materialise.py [-n 20000] [--runs 5] [--against F]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from dataset_push import generate, node_with_dataset, timed  # noqa: E402
from results import emit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=20_000, help="files (default 20,000)")
    parser.add_argument("--size", type=int, default=10_240, help="bytes per file (about)")
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (median)")
    parser.add_argument(
        "--against",
        type=Path,
        help="another runner/datasets.py (git show REV:src/gpulease/runner/datasets.py > F), "
        "timed in turns with this one",
    )
    parser.add_argument("--profile", type=Path, help="cProfile one more materialise into FILE")
    parser.add_argument(
        "--spy", type=Path, help="py-spy (every thread holding the GIL) one more into FILE"
    )
    args = parser.parse_args()
    from gpulease.runner.datasets import materialise

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tree = root / "tree"
        total = generate(tree, args.n, args.size)
        archive = root / "tree.tar"
        subprocess.run(["tar", "cf", str(archive), "-C", str(root), "tree"], check=True)
        materialised: list[float] = []
        extracted: list[float] = []
        against: list[float] = []
        with node_with_dataset(root / "server", tree) as (spec, connection):

            def node(run: str, module: Any = None) -> float:
                started = time.perf_counter()
                (module.materialise if module else materialise)(
                    replace(spec, dataset_cache=root / f"cache-{run}"),
                    connection,
                    lambda message: None,
                )
                return time.perf_counter() - started

            def untar(run: str) -> float:
                target = root / f"untar-{run}"
                target.mkdir()
                return timed(["tar", "xf", str(archive), "-C", str(target)])

            steps: list[tuple[list[float], Callable[[str], float]]] = [
                (extracted, untar),
                (materialised, node),
            ]
            if args.against:
                other = _load(args.against)
                steps.append((against, lambda run: node(f"against-{run}", other)))
            for run in range(args.runs):  # in turns, each first in some runs
                for times, step in steps[run % len(steps) :] + steps[: run % len(steps)]:
                    times.append(step(str(run)))
                print(
                    f"run {run + 1}: materialise {materialised[-1]:.3f} s, "
                    f"tar xf {extracted[-1]:.3f} s"
                    + (f", {args.against.name} {against[-1]:.3f} s" if against else ""),
                    flush=True,
                )
            if args.profile:
                profiler = cProfile.Profile()
                profiler.enable()
                node("profiled")
                profiler.disable()
                profiler.dump_stats(args.profile)
            if args.spy:
                spy = subprocess.Popen(
                    [
                        str(Path(sys.executable).parent / "py-spy"),
                        "record",
                        "--gil",
                        "--threads",
                        "-r",
                        "200",
                        "-f",
                        "raw",
                        "-o",
                        str(args.spy),
                        "-p",
                        str(os.getpid()),
                    ],
                )
                time.sleep(1)  # py-spy attaches
                node("spied")
                spy.send_signal(signal.SIGINT)
                spy.wait()
        seconds, baseline = statistics.median(materialised), statistics.median(extracted)
        ratio = seconds / baseline
        print(
            f"materialise {args.n:,} files ({total / 1e6:.0f} MB): {seconds:.3f} s, "
            f"tar xf {baseline:.3f} s: {ratio:.2f}× (medians of {args.runs})"
        )
        if against:
            print(
                f"{args.against.name}: {statistics.median(against):.3f} s, "
                f"{statistics.median(against) / baseline:.2f}× tar xf"
            )
        emit(
            f"datasets, {args.n:,} files: materialise a version (alone)",
            f"{seconds:.3f} s (into an empty node cache)",
            f"tar xf into an empty dir {baseline:.3f} s",
            f"{ratio:.2f}×",
            "<= 2× tar xf",
            ratio <= 2,
        )


def _load(path: Path) -> Any:
    """A copy of runner/datasets.py as a module of its own."""
    spec = importlib.util.spec_from_file_location("datasets_against", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    main()
