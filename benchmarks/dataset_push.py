"""Dataset push: 100,000 generated files of about 10 KB over loopback to a real server.

Reports files/s and MB/s of `gpulease dataset push` beside, in the same run and on the same
tree, `tar cf - DIR | cat > /dev/null` (reading every file; GNU tar skips the reads when its
archive is /dev/null itself, hence the pipe) and `rsync -a DIR DEST` (what renters use
today), then the time of pushing the unchanged tree again: the client's push index
(client/push_index.py) vouches for every file, so that push reads and hashes none of them.
The page cache is warm for all of them (the tree was just written). SQLite, local blob
store, the CLI as a renter runs it (its cache, and so the index, in the run's own directory).

    .venv/bin/python benchmarks/dataset_push.py [-n 100000] [--size 10240]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from processes import ADMIN_PASSWORD, Platform, free_port  # noqa: E402

FILES_PER_DIR = 1000


def generate(root: Path, count: int, size: int) -> int:
    """count files of size ±10% random bytes, FILES_PER_DIR to a directory; total bytes."""
    total = 0
    block = os.urandom(size * 2)
    for i in range(count):
        directory = root / f"class_{i // FILES_PER_DIR:03d}"
        if i % FILES_PER_DIR == 0:
            directory.mkdir(parents=True)
        length = size - size // 10 + (i * 7919) % (size // 5 + 1)
        start = (i * 104729) % size
        data = i.to_bytes(8, "big") + block[start : start + length - 8]
        (directory / f"img_{i:06d}.jpg").write_bytes(data)
        total += len(data)
    return total


def timed(argv: list[str] | str, *, shell: bool = False) -> float:
    started = time.perf_counter()
    subprocess.run(argv, shell=shell, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=100_000, help="files (default 100,000)")
    parser.add_argument("--size", type=int, default=10_240, help="bytes per file (about)")
    args = parser.parse_args()
    console = Console()
    if shutil.which("rsync") is None:
        sys.exit("rsync is missing: apt-get install -y rsync (scripts/system-deps.sh does it)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tree = root / "cat_images"
        with console.status(f"writing {args.n:,} files of about {args.size:,} bytes"):
            total = generate(tree, args.n, args.size)
        rows: list[tuple[str, float, str]] = []
        with console.status("tar"):
            rows.append(
                (
                    "tar cf - DIR | cat > /dev/null",
                    timed(f"tar cf - -C {root} cat_images | cat > /dev/null", shell=True),
                    "reads every file",
                )
            )
        with console.status("rsync"):
            rows.append(
                (
                    "rsync -a DIR DEST",
                    timed(["rsync", "-a", f"{tree}/", str(root / "copy")]),
                    "local copy",
                )
            )
        shutil.rmtree(root / "copy")
        platform = Platform(
            home=root / "home",
            database_url=f"sqlite:///{root / 'home' / 'gpulease.db'}",
            port=free_port(),
            simulated="T4:1",
            log_path=root / "server.log",
            config=root / "cli.json",
            extra_env={
                "GPULEASE_UNSANDBOXED_SINGLE_USER": "true",
                "XDG_CACHE_HOME": str(root / "cache"),
            },
        )
        platform.start()
        try:
            # the admin account: the bench server runs unsandboxed (no jobs), so no sign-up
            platform.cli(
                "login", "--server", platform.url, "--name", "admin", "--password", ADMIN_PASSWORD
            )
            pushes = []
            for label in ("gpulease dataset push", "gpulease dataset push (unchanged)"):
                with console.status(label):
                    started = time.perf_counter()
                    result = platform.cli(
                        "dataset", "push", str(tree), "--name", "cat_images", "-o", "json"
                    )
                    wall = time.perf_counter() - started
                report = json.loads(result.stdout)
                pushes.append(report)
                note = (
                    f"sent {report['sent_bytes'] / 1e6:,.1f} MB in {report['sent_chunks']:,} "
                    f"chunks; {report['index_hits']:,} files from the index"
                )
                rows.append((label, wall, note))
        finally:
            platform.stop()
    table = Table(
        title=f"dataset push: {args.n:,} files, {total / 1e6:,.0f} MB, loopback, this host"
    )
    for column in ("method", "seconds", "files/s", "MB/s", "note"):
        table.add_column(column, justify="left" if column in ("method", "note") else "right")
    for label, seconds, note in rows:
        table.add_row(
            label,
            f"{seconds:.2f}",
            f"{args.n / seconds:,.0f}",
            f"{total / 1e6 / seconds:,.1f}",
            note,
        )
    console.print(table)
    console.print(
        "push seconds include the CLI's start (about a second here); the push itself reported "
        + ", ".join(f"{p['seconds']:.2f} s" for p in pushes)
    )


if __name__ == "__main__":
    main()
