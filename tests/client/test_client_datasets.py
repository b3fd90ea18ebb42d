"""The push client's scan and file reading: chunks as scanned, a file that changed size
since its scan refused, hostile trees refused naming the file."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpulease.client.datasets import _hash_file
from gpulease.client.scan import DatasetError, scan_directory
from gpulease.storage.chunking import CHUNK_SIZE

KEPT = 64 * 1024  # files up to this size are kept in memory until they are sent


@pytest.mark.parametrize("size", [0, 1, 10_000, KEPT, KEPT + 1, CHUNK_SIZE + 17])
def test_a_file_is_cut_into_its_chunks(tmp_path: Path, size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    (tmp_path / "f.bin").write_bytes(data)
    [local] = scan_directory(tmp_path)
    refs, kept = _hash_file(local)
    pieces = [data[at : at + CHUNK_SIZE] for at in range(0, size, CHUNK_SIZE)]
    assert [(r.sha256, r.size) for r in refs] == [
        (hashlib.sha256(p).hexdigest(), len(p)) for p in pieces
    ]
    assert kept == (data if size <= KEPT else None)


@pytest.mark.parametrize("now", [b"01234", b"0123456789 and more"])
def test_a_file_that_changed_size_since_the_scan_is_refused(tmp_path: Path, now: bytes) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789")
    [local] = scan_directory(tmp_path)
    path.write_bytes(now)
    with pytest.raises(DatasetError, match="changed while it was being pushed"):
        _hash_file(local)


def _tree(root: Path) -> Path:
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "e" / "deep.txt").write_bytes(b"deep")
    (root / "top.txt").write_bytes(b"top")
    return root


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda t: os.mkfifo(t / "d" / "pipe"), "not a regular file"),
        (lambda t: os.symlink(t / "d", t / "d" / "e" / "up"), "link to a directory"),
        (lambda t: os.symlink(t / "gone", t / "broken"), "broken link"),
        (lambda t: os.symlink("/etc/hostname", t / "d" / "out"), "outside the directory"),
        (lambda t: (t / "d" / "back\\slash").write_bytes(b"x"), "\\"),
        (lambda t: (t / "d" / "e" / "tab\there").write_bytes(b"x"), "control character"),
        (lambda t: Path(os.fsdecode(bytes(t / "d") + b"/\xff")).write_bytes(b"x"), "not UTF-8"),
    ],
    ids=[
        "fifo",
        "link-to-dir",
        "broken-link",
        "link-outside",
        "backslash",
        "tab",
        "not-utf8",
    ],
)
def test_a_hostile_tree_is_refused_naming_the_file(
    tmp_path: Path, make: Callable[[Path], object], words: str
) -> None:
    tree = _tree(tmp_path / "tree")
    make(tree)
    with pytest.raises(DatasetError, match="cannot push") as refused:
        scan_directory(tree)
    assert words in str(refused.value)


def test_a_link_to_a_file_inside_is_pushed_as_a_copy_of_it(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree")
    os.symlink("e/deep.txt", tree / "d" / "alias.txt")
    files = {f.path: f for f in scan_directory(tree)}
    assert sorted(files) == ["d/alias.txt", "d/e/deep.txt", "top.txt"]
    assert files["d/alias.txt"].stat == files["d/e/deep.txt"].stat
    assert files["d/alias.txt"].size == 4
