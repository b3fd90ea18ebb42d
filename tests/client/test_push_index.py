"""The push index's digest of a scanned tree: every path and stat counts, nothing else."""

from __future__ import annotations

import array
import gc
import os
from pathlib import Path

import pytest

from gpulease.client.push_index import FileStat, scan_digest
from gpulease.client.scan import DatasetError, hand_over, scan_directory, scan_tree, taken_over

STATS = [
    FileStat(10, 1_000, 2_000, 7, 1),
    FileStat(11, 3_000, 1_500, 8, 1),
    FileStat(0, 500, 600, 9, 1),
]


def flat(*stats: FileStat) -> list[int]:
    return [number for stat in stats for number in stat]


TREE = [("a/", ["b.jpg", "c.jpg"], flat(*STATS[:2])), ("", ["d.txt"], flat(STATS[2]))]


def test_the_digest_is_the_same_for_the_same_scan_and_gives_the_newest_change() -> None:
    digest, newest = scan_digest(TREE)
    copied = [(prefix, list(names), array.array("q", stats)) for prefix, names, stats in TREE]
    assert scan_digest(copied) == (digest, newest)
    assert newest == 3_000


@pytest.mark.parametrize("field", range(5))
def test_any_changed_stat_field_changes_the_digest(field: int) -> None:
    values = list(STATS[1])
    values[field] += 1
    changed = [("a/", ["b.jpg", "c.jpg"], flat(STATS[0], FileStat(*values))), TREE[1]]
    assert scan_digest(changed)[0] != scan_digest(TREE)[0]


def test_a_renamed_or_moved_file_changes_the_digest() -> None:
    digest = scan_digest(TREE)[0]
    renamed = [("a/", ["b.jpg", "c.jpeg"], TREE[0][2]), TREE[1]]
    assert scan_digest(renamed)[0] != digest
    moved = [("a/", ["b.jpg"], flat(STATS[0])), ("", ["c.jpg", "d.txt"], flat(*STATS[1:]))]
    assert scan_digest(moved)[0] != digest
    into = [("a/", ["b.jpg", "c.jpg", "d.txt"], flat(*STATS)), ("", [], [])]
    assert scan_digest(into)[0] != digest
    assert scan_digest(TREE[::-1])[0] != digest
    swapped = [("a/", ["c.jpg", "b.jpg"], TREE[0][2]), TREE[1]]
    assert scan_digest(swapped)[0] != digest


def test_an_inode_past_two_to_the_63_is_digested_not_refused() -> None:
    huge = [FileStat(1, 5, 6, 2**64 - 1, 2**63), FileStat(1, 5, 6, 2**64 - 2, 2**63)]
    first, newest = scan_digest([("", ["x", "y"], flat(*huge))])
    assert first != scan_digest([("", ["x", "y"], flat(*huge[::-1]))])[0]
    assert newest == 6


def test_a_scanned_inode_past_two_to_the_63_is_kept_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device number or inode past 2**63 (some network filesystems give them) does not fit
    the scan's packed array: the scan keeps that directory's stats as a list."""
    from gpulease.client import scan

    (tmp_path / "x").write_bytes(b"x")
    real = scan._stat_key
    monkeypatch.setattr(scan, "_stat_key", lambda info: (*real(info)[:3], 2**64 - 1, 2**63))
    (only,) = scan_tree(tmp_path).files()
    assert only.stat is not None and only.stat[3:] == (2**64 - 1, 2**63)
    assert scan_tree(tmp_path).digest() == scan_tree(tmp_path).digest()


def test_the_scan_digest_follows_the_tree_on_disk(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    for name in ("a/b.jpg", "a/c.jpg", "d.txt"):
        (tmp_path / name).write_bytes(b"x")
    digest = scan_tree(tmp_path).digest()
    assert scan_tree(tmp_path).digest() == digest
    (tmp_path / "a" / "c.jpg").write_bytes(b"y")  # same size, new mtime and ctime
    os.utime(tmp_path / "a" / "c.jpg", ns=(1, 1))  # mtime put back far behind: ctime moved
    assert scan_tree(tmp_path).digest()[0] != digest[0]
    changed = scan_tree(tmp_path).digest()
    os.rename(tmp_path / "a" / "c.jpg", tmp_path / "c.jpg")
    assert scan_tree(tmp_path).digest()[0] != changed[0]


def test_stats_that_do_not_match_the_names_are_refused() -> None:
    with pytest.raises(ValueError, match="2 names with 5 stat fields"):
        scan_digest([("", ["x", "y"], flat(STATS[0]))])


def test_a_directory_name_is_checked_like_a_file_name(tmp_path: Path) -> None:
    (tmp_path / "bad\x01dir").mkdir()
    (tmp_path / "bad\x01dir" / "plain.txt").write_bytes(b"x")
    with pytest.raises(DatasetError, match="control character"):
        scan_directory(tmp_path)


def test_the_scan_lists_files_in_path_order_with_their_stats(tmp_path: Path) -> None:
    for name in ("b/x", "a.b", "a/z", "a/y/w", "c"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    files = scan_directory(tmp_path)
    assert [f.path for f in files] == sorted(["b/x", "a.b", "a/z", "a/y/w", "c"])
    for local in files:
        info = os.lstat(tmp_path / local.path)
        assert local.source == str(tmp_path / local.path)
        assert local.size == info.st_size == len(local.path)
        assert local.stat == FileStat.of(info)
    tree = scan_tree(tmp_path)
    assert (tree.count, tree.size) == (5, sum(f.size for f in files))


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


def test_a_handed_over_scan_is_taken_once_for_the_same_directory_only(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    root.mkdir()
    (root / "a.bin").write_bytes(b"a")
    tree = scan_tree(root)
    hand_over(root, tree)
    assert taken_over(tmp_path) is None  # another directory: and the scan is dropped
    hand_over(root, tree)
    assert taken_over(root) is tree
    assert taken_over(root) is None  # once

    hand_over(root, tree)  # then root is replaced by another directory of the same name
    root.rename(tmp_path / "moved")
    root.mkdir()
    assert taken_over(root) is None
    hand_over(root, scan_tree(root))
    root.rmdir()
    assert taken_over(root) is None  # gone
