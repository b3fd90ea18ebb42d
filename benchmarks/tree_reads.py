"""Why a job reads a materialised dataset a little slower than the tree `tar xf` made: the
order its files were created in, not the sandbox.

One tree of generated files (benchmarks/dataset_push.py's, about 10 KB each) is written
three more times, each on the same disk, all in the page cache:

- name order: file by file in sorted path order, as materialise writes a version (its file
  list is sorted);
- directory order: file by file in the order `os.walk` lists the source (the file system's
  own directory order, which is a hash of each name, not the name);
- tar xf: `tar cf - SRC | tar xf -`, which creates files in the order it read the source,
  that is directory order again.

Each tree is then read whole by a job (every file opened and read to its end) three ways:
in directory order (`os.walk`, as dataset_push.py's read figure does), in sorted order (as
torchvision's ImageFolder lists a dataset) and shuffled (as a DataLoader visits it), under
bubblewrap with the tree bound read-only at /mnt/data/NAME as the sandbox binds /data/NAME,
and once more unbound (the sandbox's bind mount against none). Files/s, medians of --runs,
the trees in turns; each figure is printed beside the tar xf tree's, read the same way in
the same turns.

    .venv/bin/python benchmarks/tree_reads.py [-n 20000] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import tempfile
from pathlib import Path

from dataset_push import READER, generate, read_rate
from results import emit
from rich.console import Console
from rich.table import Table

SORTED_READER = READER.replace(
    "for directory, _, names in os.walk(sys.argv[1]):\n    for name in names:",
    "for directory, dirs, names in os.walk(sys.argv[1]):\n"
    "    dirs.sort()\n"
    "    for name in sorted(names):",
)
assert SORTED_READER != READER, "dataset_push.READER changed: sort its walk here again"
SHUFFLED_READER = """
import os, random, sys, time
paths = [os.path.join(d, n) for d, _, names in os.walk(sys.argv[1]) for n in names]
random.Random(0).shuffle(paths)
started = time.perf_counter()
for path in paths:
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass
print(len(paths), time.perf_counter() - started)
"""
READERS = {
    "directory order": READER,
    "sorted order": SORTED_READER,
    "shuffled order": SHUFFLED_READER,
}
INSIDE = "/mnt/data/cats"


def copy_in_order(source: Path, target: Path, order: list[Path]) -> None:
    """target: source's files written one by one in that order (directories first)."""
    for directory in sorted({path.parent for path in order}):
        (target / directory).mkdir(parents=True, exist_ok=True)
    for path in order:
        data = (source / path).read_bytes()
        fd = os.open(target / path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            os.pwrite(fd, data, 0)
        finally:
            os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=20_000, help="files (default 20,000)")
    parser.add_argument("--runs", type=int, default=5, help="turns (the figures are medians)")
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source = root / "source"
        with console.status(f"writing {args.n:,} files four times"):
            generate(source, args.n, 10_240)
            listed = [
                Path(directory).relative_to(source) / name
                for directory, _, names in os.walk(source)
                for name in names
            ]
            trees = {"name order": root / "name", "directory order": root / "directory"}
            copy_in_order(source, trees["name order"], sorted(listed))
            copy_in_order(source, trees["directory order"], listed)
            trees["tar xf"] = root / "tar"
            trees["tar xf"].mkdir()
            subprocess.run(
                f"tar cf - -C {source} . | tar xf - -C {trees['tar xf']}", shell=True, check=True
            )
        rates: dict[tuple[str, str, bool], list[float]] = {}
        with console.status(f"reading, {args.runs} turns"):
            for turn in range(args.runs):
                names = list(trees)
                random.Random(turn).shuffle(names)  # no tree always first or last
                for name in names:
                    for how, reader in READERS.items():
                        for bound in (True, False):
                            inside = INSIDE if bound else str(trees[name])
                            rate = read_rate(trees[name], inside, reader)
                            rates.setdefault((name, how, bound), []).append(rate)
    table = Table(title=f"a job's reads of {args.n:,} files, files/s (medians of {args.runs})")
    table.add_column("tree written in")
    for how in READERS:
        table.add_column(f"read in {how}", justify="right")
    table.add_column("unbound, directory order", justify="right")
    for name in trees:
        cells = [f"{statistics.median(rates[(name, how, True)]):,.0f}" for how in READERS]
        cells.append(f"{statistics.median(rates[(name, 'directory order', False)]):,.0f}")
        table.add_row(name, *cells)
    console.print(table)
    for how in READERS:
        tar = statistics.median(rates[("tar xf", how, True)])
        for name in ("name order", "directory order"):
            value = statistics.median(rates[(name, how, True)])
            emit(
                f"reads in {how} of a tree written in {name}, {args.n:,} files",
                f"{value:,.0f} files/s",
                f"the tar xf tree {tar:,.0f} files/s",
                f"{value / tar:.2f}×",
                "",
                None,
            )


if __name__ == "__main__":
    main()
