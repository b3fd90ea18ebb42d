"""Materialising a dataset version on a node, beside `tar xf` of the same tree, in turns.

As a node meets it: a tree of generated files of about 10 KB is pushed once to a server
(SQLite, local blob store, sealed chunks), which then runs in a process of its own and
answers on a Unix socket, as a server answers the runners of its node. Each run extracts a
tar of the tree into an empty directory and, in a process of its own as a runner does,
materialises the version into an empty node cache with the runner's materialise()
(runner/datasets.py: the file list, chunk packs, decrypting and checking every chunk,
writing the tree read-only), timed inside that process. The steps take turns (each first
in some runs) and the disk is synced before each, untimed. The runs' trees are kept until
the end (about 10 GB at 100,000 files and 3 runs of two copies): on this host's ext4, files
created within half a minute of many others being removed cost several times as much
kernel time (the inode allocator skips recently freed inodes one by one), which would
charge each step for the removal of the one before.

--against SRC times another copy of the code (server and runner both: the wire between
them may differ), each with its own server process, in the same turns:
`git archive REV src | tar x -C DIR` and then `--against DIR/src`; --source SRC times
another copy than this checkout's src in its place. With --profile FILE one
more materialise runs under cProfile (the runner's main thread), its statistics written to
FILE (`python -m pstats FILE`); with --spy FILE py-spy samples every thread of the runner
and of the server while they hold the GIL during one more, into FILE.runner and
FILE.server (raw format). --fetch-only leaves the files' writes out of materialise (its
directories are made, its files are not): what is left is the transfer (the file list, the
chunk packs, opening and checking every chunk), timed without the kernel's cost of making
the files, which moves by several times from one run to the next on this host's disk.

    .venv/bin/python benchmarks/dataset_materialise.py [-n 20000] [--runs 5] [--against SRC]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import pickle
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS.parent / "tests"))
from dataset_push import generate, node_with_dataset, process_times, timed  # noqa: E402
from results import emit  # noqa: E402

SOURCE = BENCHMARKS.parent / "src"
_SPEC = "spec.pickle"
_SOCKET = "server.sock"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=20_000, help="files (default 20,000)")
    parser.add_argument("--size", type=int, default=10_240, help="bytes per file (about)")
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (median)")
    parser.add_argument(
        "--against",
        type=Path,
        help="another copy of the code's src (git archive REV src | tar x -C DIR: DIR/src), "
        "timed in turns with this one",
    )
    parser.add_argument(
        "--source",
        type=Path,
        default=SOURCE,
        help="the code's src to time (default: this checkout's)",
    )
    parser.add_argument("--profile", type=Path, help="cProfile one more materialise into FILE")
    parser.add_argument(
        "--spy", type=Path, help="py-spy (every thread holding the GIL) one more into FILE.*"
    )
    parser.add_argument(
        "--fetch-only",
        action="store_true",
        help="leave the files' writes out: time the transfer alone (tar xf is still timed)",
    )
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # a server process
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--materialise", type=Path, help=argparse.SUPPRESS)  # a runner
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.tree)
        return
    if args.materialise:
        found = materialise_once(args.materialise, args.cache, args.profile, args.fetch_only)
        print(json.dumps(found))
        return

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tree = root / "tree"
        total = generate(tree, args.n, args.size)
        sources = {"materialise": args.source.resolve()}
        if args.against:
            sources["against"] = args.against.resolve()
        with nodes(root, tree, sources, fetch_only=args.fetch_only) as node:
            times, cpu, user = in_turns(root, tree, node, args.runs, print)
            extracted = times.pop("tar xf")
            if args.profile:
                node.materialise("materialise", root / "cache-profiled", profile=args.profile)
            if args.spy:
                node.spy("materialise", root / "cache-spied", args.spy)
        # reported before the trees are removed: at 100,000 files that takes minutes
        seconds, baseline = statistics.median(times["materialise"]), statistics.median(extracted)
        ratio = seconds / baseline
        print(
            f"materialise {args.n:,} files ({total / 1e6:.0f} MB): {seconds:.3f} s, "
            f"tar xf {baseline:.3f} s: {ratio:.2f}× (medians of {args.runs})"
        )
        for name, found in times.items():
            if name != "materialise":
                other = statistics.median(found)
                print(f"{name}: {other:.3f} s, {other / baseline:.2f}× tar xf")
        print(
            "CPU-s (medians; materialise: runner and server): "
            + ", ".join(f"{name} {statistics.median(found):.2f}" for name, found in cpu.items())
        )
        print(
            "of which user CPU-s (medians, not the kernel's): "
            + ", ".join(f"{name} {statistics.median(found):.2f}" for name, found in user.items())
        )
        if args.fetch_only:  # not the figure the target is for
            emit(
                f"datasets, {args.n:,} files: a version's transfer (no file written)",
                f"{seconds:.3f} s",
                f"tar xf into an empty dir {baseline:.3f} s",
                f"{ratio:.2f}×",
                "",
                None,
            )
            return
        emit(
            f"datasets, {args.n:,} files: materialise a version (alone)",
            f"{seconds:.3f} s (into an empty node cache)",
            f"tar xf into an empty dir {baseline:.3f} s",
            f"{ratio:.2f}×",
            "<= 2× tar xf",
            ratio <= 2,
        )


class Nodes:
    """A server process per copy of the code, each with the tree pushed, and runner
    processes that materialise its version."""

    def __init__(
        self,
        root: Path,
        servers: dict[str, tuple[Path, Path, subprocess.Popen[bytes]]],
        fetch_only: bool = False,
    ):
        self.root = root
        self.servers = servers  # name -> (its src, its home, its process)
        self.fetch_only = fetch_only

    def materialise(self, name: str, cache: Path, *, profile: Path | None = None) -> Any:
        """Runs one runner process of copy `name` into cache: {"seconds", "cpu" (its CPU
        seconds, all threads), "user" (of those, in user mode), "directory" (the
        version's)}."""
        source, home, _ = self.servers[name]
        argv = self._runner_argv(home, cache)
        if profile:
            argv += ["--profile", str(profile)]
        done = subprocess.run(argv, env=_env(source), capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the {name} runner failed: {done.stderr[-3000:]}")
        return json.loads(done.stdout.splitlines()[-1])

    def _runner_argv(self, home: Path, cache: Path) -> list[str]:
        argv = [*_python(), "--materialise", str(home), "--cache", str(cache)]
        return [*argv, "--fetch-only"] if self.fetch_only else argv

    def spy(self, name: str, cache: Path, out: Path) -> None:
        source, home, server = self.servers[name]
        wait = _env(source) | {"GPULEASE_BENCH_WAIT": "1"}
        runner = subprocess.Popen(self._runner_argv(home, cache), env=wait)
        spies = [
            subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--gil", "--threads"]
                + ["-r", "200", "-f", "raw", "-o", f"{out}.{what}", "-p", str(pid)]
            )
            for what, pid in (("runner", runner.pid), ("server", server.pid))
        ]
        runner.wait()
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait()


@contextlib.contextmanager
def nodes(
    root: Path, tree: Path, sources: dict[str, Path], *, fetch_only: bool = False
) -> Iterator[Nodes]:
    """A server process per copy of the code (name -> its src), each with tree pushed."""
    servers: dict[str, tuple[Path, Path, subprocess.Popen[bytes]]] = {}
    try:
        for name, source in sources.items():
            home = root / f"server-{len(servers)}"
            home.mkdir()
            argv = [*_python(), "--serve", str(home), "--tree", str(tree)]
            log = (home / "server.log").open("wb")
            process = subprocess.Popen(argv, env=_env(source), stdout=log, stderr=log)
            servers[name] = (source, home, process)
        deadline = time.monotonic() + 1800  # pushing 100,000 files takes a while
        for name, (_, home, process) in servers.items():  # the pushes run side by side
            while not (home / _SOCKET).exists():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the {name} server: {(home / 'server.log').read_text()}")
                time.sleep(0.2)
        yield Nodes(root, servers, fetch_only)
    finally:
        for _, _, process in servers.values():
            process.terminate()
        for _, _, process in servers.values():
            process.wait(30)


def in_turns(
    root: Path, tree: Path, node: Nodes, runs: int, say: Callable[[str], None]
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]]]:
    """Seconds of each run of `tar xf` and of each copy's materialise, in turns, and the CPU
    seconds each took (tar's; the runner's and its server's together), and of those the
    user CPU seconds (what is not the kernel's: creating 20,000 files costs the kernel
    several times as much in one run as in another here, which hides a change in the
    code's own time); the last run's trees are left at root/last-tar-xf and root/last-NAME
    (the version's directory)."""
    archive = root / "tree.tar"
    subprocess.run(["tar", "cf", str(archive), "-C", str(tree.parent), tree.name], check=True)
    names = ["tar xf", *node.servers]
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    user: dict[str, list[float]] = {name: [] for name in names}
    for run in range(runs):
        order = names[run % len(names) :] + names[: run % len(names)]
        for name in order:
            target = root / f"run-{run}-{name.replace(' ', '-')}"
            target.mkdir()
            os.sync()  # what the step before left to write out is not this one's cost
            if name == "tar xf":
                before = _children_cpu()
                times[name].append(timed(["tar", "xf", str(archive), "-C", str(target)]))
                after = _children_cpu()
                cpu[name].append(sum(after) - sum(before))
                user[name].append(after[0] - before[0])
                made = target / tree.name
            else:
                server = node.servers[name][2].pid
                before = process_times(server)
                found = node.materialise(name, target)
                after = process_times(server)
                cpu[name].append(found["cpu"] + sum(after) - sum(before))
                user[name].append(found["user"] + after[0] - before[0])
                times[name].append(found["seconds"])
                made = Path(found["directory"])
            if run == runs - 1:
                made.rename(root / f"last-{name.replace(' ', '-')}")
        say(
            f"run {run + 1}: "
            + ", ".join(
                f"{n} {times[n][-1]:.3f} s ({cpu[n][-1]:.2f} CPU-s, {user[n][-1]:.2f} user)"
                for n in names
            )
        )
    return times, cpu, user


def _children_cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def _python() -> list[str]:
    return [sys.executable, str(Path(__file__).resolve())]


def _env(source: Path) -> dict[str, str]:
    return os.environ | {"PYTHONPATH": str(source)}


def serve(home: Path, tree: Path) -> None:
    """The server process: the tree pushed as dataset "cats" with an instance mounting it
    (its runner spec left in home), then the app on a Unix socket in home until SIGTERM."""
    import uvicorn

    from factories import make_settings
    from gpulease.backends.fake import FakeBackend
    from gpulease.server.app import create_app
    from gpulease.server.runtime import build_runtime

    with node_with_dataset(home / "data", tree) as (spec, _):
        (home / _SPEC).write_bytes(pickle.dumps(spec))
    data = home / "data"
    settings = make_settings(data, f"sqlite:///{data / 'gpulease.db'}")
    runtime = build_runtime(settings, FakeBackend())
    app = create_app(settings, runtime=runtime, reconcilers=False)
    # As `gpulease server` does (server/runner_socket.serve): what exists at start-up is kept
    # out of the collector's way. Without it each full collection a manifest's decoding sets
    # off goes through every object of the process: 0.14 s instead of 0.04 s for 20,000 files,
    # before the runner sees the first file of its list.
    gc.freeze()
    uvicorn.run(app, uds=str(home / _SOCKET), log_level="warning", access_log=False)


def materialise_once(
    home: Path, cache: Path, profile: Path | None, fetch_only: bool = False
) -> dict[str, object]:
    """A runner process: materialises the version of the server in home into cache (with
    fetch_only, every batch fetched, opened and checked, and none of its files written)."""
    import cProfile

    from gpulease.runner import datasets
    from gpulease.runner.connection import Connection
    from gpulease.runner.datasets import materialise

    if fetch_only:
        datasets._Tree.write = lambda self, batch, plain: None  # type: ignore[method-assign]

    spec = replace(pickle.loads((home / _SPEC).read_bytes()), dataset_cache=cache)
    connection = Connection(
        "http://localhost", spec.token, on_stop=lambda why: None, server_socket=home / _SOCKET
    )
    if os.environ.get("GPULEASE_BENCH_WAIT"):
        time.sleep(1)  # py-spy attaches
    profiler = cProfile.Profile() if profile else None
    started, before = time.perf_counter(), os.times()
    if profiler:
        profiler.enable()
    found = materialise(spec, connection, lambda message: None)
    seconds, after = time.perf_counter() - started, os.times()
    user = after.user - before.user
    cpu = user + after.system - before.system
    if profiler and profile:
        profiler.disable()
        profiler.dump_stats(profile)
    connection.close()
    return {"seconds": seconds, "cpu": cpu, "user": user, "directory": str(found["cats"])}


if __name__ == "__main__":
    main()
