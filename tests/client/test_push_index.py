"""The push index's digest of a scanned tree: every path and stat counts, nothing else."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from gpulease.client.datasets import DatasetError, scan_directory
from gpulease.client.push_index import FileStat, scan_digest

PATHS = ["a/b.jpg", "a/c.jpg", "d.txt"]
STATS = [
    FileStat(10, 1_000, 2_000, 7, 1),
    FileStat(11, 3_000, 1_500, 8, 1),
    FileStat(0, 500, 600, 9, 1),
]


def test_the_digest_is_the_same_for_the_same_scan_and_gives_the_newest_change() -> None:
    digest, newest = scan_digest(PATHS, STATS)
    assert scan_digest(list(PATHS), list(STATS)) == (digest, newest)
    assert newest == 3_000


@pytest.mark.parametrize("field", range(5))
def test_any_changed_stat_field_changes_the_digest(field: int) -> None:
    changed = list(STATS)
    values = list(changed[1])
    values[field] += 1
    changed[1] = FileStat(*values)
    assert scan_digest(PATHS, changed)[0] != scan_digest(PATHS, STATS)[0]


def test_a_renamed_or_moved_file_changes_the_digest() -> None:
    digest = scan_digest(PATHS, STATS)[0]
    assert scan_digest(["a/b.jpg", "a/c.jpeg", "d.txt"], STATS)[0] != digest
    assert scan_digest(["a/b.jpg", "a", "c.jpg/d.txt"], STATS)[0] != digest
    assert scan_digest(PATHS[::-1], STATS[::-1])[0] != digest


def test_an_inode_past_two_to_the_63_is_digested_not_refused() -> None:
    huge = [FileStat(1, 5, 6, 2**64 - 1, 2**63), FileStat(1, 5, 6, 2**64 - 2, 2**63)]
    first, newest = scan_digest(["x", "y"], huge)
    assert first != scan_digest(["x", "y"], huge[::-1])[0]
    assert newest == 6


def test_the_scan_leaves_the_garbage_collector_as_it_found_it(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x")
    (tmp_path / "bad\x01name").write_bytes(b"y")
    assert gc.isenabled()
    with pytest.raises(DatasetError, match="bad"):
        scan_directory(tmp_path)
    assert gc.isenabled()
    (tmp_path / "bad\x01name").unlink()
    gc.disable()
    try:
        assert [f.path for f in scan_directory(tmp_path)] == ["d/f"]
        assert not gc.isenabled()
    finally:
        gc.enable()
