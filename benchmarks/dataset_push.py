"""Datasets at disk speed: push, unchanged re-push, materialise on a node, a job's reads.

Each figure is the median of several runs, beside its baseline measured in the same run on
the same tree of generated files of about 10 KB (the page cache is warm for all of them):

- first push: `gpulease dataset push` (the CLI as a renter runs it, over loopback to a real
  server: SQLite, local blob store, sealed chunks) of a tree it has never seen, beside
  `tar cf - DIR | cat > /dev/null` of that tree (reads every file; GNU tar skips the reads
  when its archive is /dev/null itself, hence the pipe). Each run pushes a tree of new
  content to a new dataset, so nothing is deduplicated away.
- unchanged re-push: the same command on the tree it just pushed, beside the first push.
  The push index and the server's manifest digest settle it without reading a file.
- re-push, one file changed: the same command after one file of that tree was rewritten,
  beside the first push (with --against, the old code's in turns beside it). Only that
  file's chunk is sent, but the file list of every file still goes to the server.
- materialise: the runner's materialise() (runner/datasets.py) of the pushed version into an
  empty node cache: the file list, chunk packs, decrypting and checking every chunk,
  writing the tree read-only; beside `tar xf` of a tar of the same tree into an empty
  directory, in turns. As a node meets it: the server runs in a process of its own and
  answers on a Unix socket, the runner in another (benchmarks/dataset_materialise.py).
- re-push scan: what an unchanged re-push does per file (scan, stat digest; nothing is
  read) at 100,000 files (--scan-files), beside `find` printing every file's stat.
- read: a job reading every file of the materialised version through a read-only bind
  mount, as the sandbox mounts it at /data/NAME (here bubblewrap binds it at
  /mnt/data/NAME: the host has no /data to mount on), beside the same job reading the
  plain directory that tar extracted. Files/s, both measured inside the job.

Push seconds are those the push reports (the CLI's start, about a second here, is not in
them; its wall time is printed too).

    .venv/bin/python benchmarks/dataset_push.py [-n 20000] [--size 10240] [--runs 3]

With --against OLD/src the first push of each tree is made twice, in turns (the order
alternating run by run), by this code and by the code under OLD/src (server and CLI, each
on a server of its own: `git archive COMMIT src | tar -x -C OLD`), beside tar of the same
tree in the same turn; --push-only leaves out the other figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from results import emit  # noqa: E402
from temp_platform import sqlite_platform  # noqa: E402

from processes import ADMIN_PASSWORD, Platform  # noqa: E402

FILES_PER_DIR = 1000
Row = tuple[str, float, str, float, str]  # what, seconds, note, baseline seconds, baseline
READER = """
import os, sys, time
started = time.perf_counter()
count = 0
for directory, _, names in os.walk(sys.argv[1]):
    for name in names:
        with open(os.path.join(directory, name), "rb") as f:
            while f.read(1 << 20):
                pass
        count += 1
print(count, time.perf_counter() - started)
"""


def generate(root: Path, count: int, size: int, salt: int = 0) -> int:
    """count files of size ±10% random bytes, FILES_PER_DIR to a directory; total bytes.
    Trees of different salts share no file content."""
    total = 0
    block = os.urandom(size * 2)
    for i in range(count):
        directory = root / f"class_{i // FILES_PER_DIR:03d}"
        if i % FILES_PER_DIR == 0:
            directory.mkdir(parents=True)
        length = size - size // 10 + (i * 7919) % (size // 5 + 1)
        start = (i * 104729) % size
        data = salt.to_bytes(4, "big") + i.to_bytes(8, "big") + block[start : start + length - 12]
        (directory / f"img_{i:06d}.jpg").write_bytes(data)
        total += len(data)
    return total


def timed(argv: list[str] | str, *, shell: bool = False) -> float:
    started = time.perf_counter()
    subprocess.run(argv, shell=shell, check=True, capture_output=True)
    return time.perf_counter() - started


def tar_read(tree: Path) -> float:
    return timed(f"tar cf - -C {tree.parent} {tree.name} | cat > /dev/null", shell=True)


def push(platform: Platform, tree: Path, name: str) -> tuple[float, float, dict[str, object]]:
    """(seconds the push reported, wall seconds of the CLI, its JSON report); the report
    gains "cpu": CPU seconds of the server and the CLI (its start included) for the push,
    a figure that a loaded host inflates far less than the seconds, and "server_cpu" and
    "server_kernel": the server's share of it, and of that the kernel's."""
    assert platform.proc is not None
    server_before = process_times(platform.proc.pid)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = platform.cli("dataset", "push", str(tree), "--name", name, "-o", "json")
    wall = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = json.loads(result.stdout)
    user, kernel = process_times(platform.proc.pid)
    server = (user - server_before[0], kernel - server_before[1])
    report["server_cpu"], report["server_kernel"] = sum(server), server[1]
    report["cpu"] = (
        sum(server)
        + children.ru_utime
        + children.ru_stime
        - children_before.ru_utime
        - children_before.ru_stime
    )
    return float(report["seconds"]), wall, report


def process_times(pid: int) -> tuple[float, float]:
    """CPU seconds (user, system) a running process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _push_platform(root: Path, pythonpath: str | None = None) -> Platform:
    """A started server under root, its CLI logged in as the admin; pythonpath: the code
    both run (None: this checkout's)."""
    extra = {"GPULEASE_UNSANDBOXED_SINGLE_USER": "true", "XDG_CACHE_HOME": str(root / "cache")}
    if pythonpath is not None:
        extra["PYTHONPATH"] = pythonpath
    platform = sqlite_platform(root, "T4:1", extra)
    platform.start()
    # the admin account: the bench server runs unsandboxed (no jobs), so no sign-up
    platform.cli("login", "--server", platform.url, "--name", "admin", "--password", ADMIN_PASSWORD)
    return platform


def bench_push(root: Path, args: argparse.Namespace, console: Console) -> tuple[list[Row], Path]:
    root.joinpath("new").mkdir()
    platform = _push_platform(root / "new")
    old = None
    firsts: list[float] = []
    walls: list[float] = []
    tars: list[float] = []
    olds: list[float] = []
    cpus: dict[str, list[float]] = {"new": [], "old": []}
    servers: dict[str, list[tuple[float, float]]] = {"new": [], "old": []}
    try:
        if args.against is not None:
            root.joinpath("old").mkdir()
            old = _push_platform(root / "old", str(Path(args.against).resolve()))
        tree = root / "tree"
        for run in range(args.runs):
            if tree.exists():
                shutil.rmtree(tree)
            with console.status(f"first push {run + 1}/{args.runs}: writing the tree"):
                generate(tree, args.n, args.size, salt=run + 1)
                subprocess.run(["sync"], check=True)
            with console.status(f"first push {run + 1}/{args.runs}"):
                tars.append(tar_read(tree))
                turns = [(platform, firsts, walls, "new"), (old, olds, [], "old")]
                for server, seconds_of, walls_of, which in turns[:: 1 if run % 2 == 0 else -1]:
                    if server is None:
                        continue
                    seconds, wall, report = push(server, tree, f"cats-{run}")
                    assert report["sent_chunks"] == args.n, report
                    seconds_of.append(seconds)
                    walls_of.append(wall)
                    cpus[which].append(float(report["cpu"]))  # type: ignore[arg-type]
                    servers[which].append(
                        (float(report["server_cpu"]), float(report["server_kernel"]))  # type: ignore[arg-type]
                    )
                load = os.getloadavg()[0]
                console.print(
                    f"run {run + 1}: tar {tars[-1]:.3f} s, first push {firsts[-1]:.3f} s "
                    f"({_cpu_words(cpus['new'][-1], servers['new'][-1])})"
                    + (
                        f", old code {olds[-1]:.3f} s "
                        f"({_cpu_words(cpus['old'][-1], servers['old'][-1])})"
                        if olds
                        else ""
                    )
                    + f" (load {load:.1f})"
                )
        agains, again_walls = [], []
        changed: dict[str, list[float]] = {"new": [], "new wall": [], "old": [], "old wall": []}
        if not args.push_only:
            with console.status("unchanged re-push"):
                for _ in range(max(args.runs, 5)):
                    seconds, wall, report = push(platform, tree, f"cats-{args.runs - 1}")
                    assert report["unchanged"] and report["sent_bytes"] == 0, report
                    agains.append(seconds)
                    again_walls.append(wall)
            with console.status("re-push, one file changed"):
                touched = tree / "class_000" / "img_000000.jpg"
                for run in range(args.runs):
                    touched.write_bytes(b"changed %d " % run + os.urandom(args.size))
                    turns = [(platform, "new"), (old, "old")][:: 1 if run % 2 == 0 else -1]
                    for server, which in turns:
                        if server is None:
                            continue
                        seconds, wall, report = push(server, tree, f"cats-{args.runs - 1}")
                        assert report["sent_chunks"] == 1, report
                        changed[which].append(seconds)
                        changed[f"{which} wall"].append(wall)
    finally:
        platform.stop()
        if old is not None:
            old.stop()
    first, tar = statistics.median(firsts), statistics.median(tars)
    rows = [
        (
            "first push",
            first,
            f"CLI wall {statistics.median(walls):.2f} s, "
            f"{statistics.median(cpus['new']):.2f} CPU-s server+CLI"
            + _server_words(servers["new"]),
            tar,
            "tar cf - DIR | cat",
        )
    ]
    if olds:
        rows.append(
            (
                "first push, old code",
                statistics.median(olds),
                f"{statistics.median(cpus['old']):.2f} CPU-s server+CLI"
                + _server_words(servers["old"]),
                tar,
                "tar cf - DIR | cat",
            )
        )
    if agains:
        rows.append(
            (
                "unchanged re-push",
                statistics.median(agains),
                f"CLI wall {statistics.median(again_walls):.2f} s",
                first,
                "the first push",
            )
        )
    for which, suffix in (("new", ""), ("old", ", old code")):
        if changed[which]:
            rows.append(
                (
                    f"re-push, one file changed{suffix}",
                    statistics.median(changed[which]),
                    f"CLI wall {statistics.median(changed[f'{which} wall']):.2f} s",
                    first,
                    "the first push",
                )
            )
    return rows, tree


def _cpu_words(cpu: float, server: tuple[float, float]) -> str:
    return f"{cpu:.2f} CPU-s, server {server[0]:.2f}, kernel {server[1]:.2f}"


def _server_words(servers: list[tuple[float, float]]) -> str:
    """The server's CPU seconds and their kernel share, medians of each, when measured."""
    if not servers:
        return ""
    total = statistics.median(cpu for cpu, _ in servers)
    kernel = statistics.median(kernel for _, kernel in servers)
    return f" (server {total:.2f}, of it kernel {kernel:.2f})"


@contextlib.contextmanager
def node_with_dataset(home: Path, tree: Path) -> Iterator[tuple[Any, Any]]:
    """An in-process server (SQLite under `home`, a fake backend) with `tree` pushed as
    dataset "cats" and an instance that mounts it: yields that instance's runner spec and a
    runner connection to the app, for timing the runner's materialise()."""
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

    from datasets_support import runner_connection, sdk
    from factories import make_settings, make_user
    from gpulease.backends.fake import FakeBackend
    from gpulease.server.app import create_app
    from gpulease.server.reconcilers.loop import run_once
    from gpulease.server.runtime import build_runtime

    settings = make_settings(home, f"sqlite:///{home / 'gpulease.db'}")
    backend = FakeBackend()
    runtime = build_runtime(settings, backend)
    try:
        with TestClient(create_app(settings, runtime=runtime, reconcilers=False)) as http:
            ann = make_user(http, "ann")
            sdk(ann).datasets.push(tree, "cats", use_index=False)
            created = ann.post("/api/v1/instances", json={"datasets": ["cats"]})
            assert created.status_code == 201, created.text
            run_once(runtime)
            handle = backend.handle_for(int(created.json()["id"]))
            assert handle is not None
            spec = backend.runners[handle].spec
            connection = runner_connection(http, spec.token)
            try:
                yield spec, connection
            finally:
                connection.close()
    finally:
        runtime.engine.dispose()


def bench_node(root: Path, tree: Path, args: argparse.Namespace, console: Console) -> list[Row]:
    """Materialise and tar xf in turns, the server in a process of its own as a node meets
    it (benchmarks/dataset_materialise.py), then a job's reads of the last run's trees."""
    from dataset_materialise import SOURCE, in_turns, nodes

    home = root / "node"
    home.mkdir()
    with contextlib.ExitStack() as stack:
        with console.status("node side: pushing the tree to a server of its own"):
            node = stack.enter_context(nodes(home, tree, {"materialise": SOURCE}))
        with console.status(f"materialise and tar xf in turns, {args.runs} runs"):
            times, _, _ = in_turns(home, tree, node, args.runs, lambda line: None)
    materialised, extracted = times["materialise"], times["tar xf"]
    version_dir, plain = home / "last-materialise", home / "last-tar-xf"
    jobs: list[float] = []
    plains: list[float] = []
    with console.status("reads"):
        for run in range(max(args.runs, 5)):  # in turns, each first every other run
            pair = [(jobs, version_dir, "/mnt/data/cats"), (plains, plain, str(plain))]
            for rates, source, inside in pair[:: 1 if run % 2 == 0 else -1]:
                rates.append(read_rate(source, inside))
    return [
        (
            "materialise a version",
            statistics.median(materialised),
            "into an empty node cache",
            statistics.median(extracted),
            "tar xf into an empty dir",
        ),
        (
            "job reads /data/NAME",
            args.n / statistics.median(jobs),
            f"{statistics.median(jobs):,.0f} files/s",
            args.n / statistics.median(plains),
            f"plain dir, {statistics.median(plains):,.0f} files/s",
        ),
    ]


def bench_scan(root: Path, args: argparse.Namespace, console: Console) -> list[Row]:
    """The unchanged re-push's only per-file work at --scan-files files: the scan (one
    lstat a file) and its digest, beside `find` printing every file's stat. The rest of
    that push is one request, whatever the size."""
    from gpulease.client.scan import scan_tree

    tree = root / "scan-tree"
    with console.status(f"writing {args.scan_files:,} small files"):
        for i in range(args.scan_files):
            directory = tree / f"class_{i // FILES_PER_DIR:03d}"
            if i % FILES_PER_DIR == 0:
                directory.mkdir(parents=True)
            (directory / f"img_{i:06d}.jpg").write_bytes(b"x")
    scans, finds = [], []
    find = f"find {tree} -type f -printf '%s %T@ %C@ %i %D\\n' > /dev/null"
    with console.status("scans"):
        for _ in range(max(args.runs, 5)):
            started = time.perf_counter()
            scan_tree(tree).digest()
            scans.append(time.perf_counter() - started)
            finds.append(timed(find, shell=True))
    return [
        (
            f"re-push scan, {args.scan_files:,} files",
            statistics.median(scans),
            "scan + digest, no file read",
            statistics.median(finds),
            "find -printf each stat",
        )
    ]


def read_rate(source: Path, inside: str, reader: str = READER) -> float:
    """Files per second of the reader job on source, seen by the job at `inside` (source's
    own path: not bound)."""
    argv = [sys.executable, "-c", reader, inside]
    if shutil.which("bwrap"):
        bind = (
            [] if inside == str(source) else ["--tmpfs", "/mnt", "--ro-bind", str(source), inside]
        )
        argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *bind, *argv]
    elif inside != str(source):
        argv[-1] = str(source)  # no bubblewrap: the job reads the version's directory itself
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout.split()
    return int(out[0]) / float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=20_000, help="files (default 20,000)")
    parser.add_argument("--size", type=int, default=10_240, help="bytes per file (about)")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument(
        "--scan-files", type=int, default=100_000, help="files of the re-push scan figure"
    )
    parser.add_argument(
        "--against", metavar="OLD/src", help="also push each tree with the code under OLD/src"
    )
    parser.add_argument(
        "--push-only", action="store_true", help="only the first push (and --against)"
    )
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows, tree = bench_push(root, args, console)
        if not args.push_only:
            rows += bench_node(root, tree, args, console)
            rows += bench_scan(root, args, console)
        report(rows, args, console)  # before the tree is removed: that takes a while


def _target(label: str, seconds: float, baseline: float, files: int) -> tuple[str, bool | None]:
    """The issue's target for a row, and whether it was met (None: no target at this size)."""
    ratio = seconds / baseline
    if label.startswith("first push"):
        return "<= 2× tar", ratio <= 2
    if label.startswith("materialise"):
        return "<= 2× tar xf", ratio <= 2
    if label.startswith("job reads"):
        return ">= 0.95× plain reads (time ratio <= 1.05)", ratio <= 1.05
    if label.startswith("unchanged re-push") and files >= 100_000:
        return "<= 0.5 s at 100,000 files", seconds <= 0.5
    return "", None


def report(rows: list[Row], args: argparse.Namespace, console: Console) -> None:
    table = Table(
        title=f"datasets: {args.n:,} files of about {args.size:,} bytes, medians of "
        f"{args.runs}+ runs, this host"
    )
    for column in ("what", "seconds", "note", "baseline s", "baseline", "ratio"):
        numeric = column in ("seconds", "baseline s", "ratio")
        table.add_column(column, justify="right" if numeric else "left")
    for label, seconds, note, baseline, what in rows:
        table.add_row(
            label,
            f"{seconds:.3f}",
            note,
            f"{baseline:.3f}",
            what,
            f"{seconds / baseline:.2f}×",
        )
        target, met = _target(label, seconds, baseline, args.n)
        emit(
            f"datasets, {args.n:,} files: {label}",
            f"{seconds:.3f} s ({note})",
            f"{what} {baseline:.3f} s",
            f"{seconds / baseline:.2f}×",
            target,
            met,
        )
    console.print(table)
    console.print(
        "ratio: seconds over baseline seconds (targets: first push ≤ 2× tar, unchanged "
        "re-push ≤ 0.5 s at 100,000 files, materialise ≤ 2× tar xf, reads ≥ 0.95× plain, "
        "i.e. a ratio ≤ 1.05)"
    )


if __name__ == "__main__":
    main()
