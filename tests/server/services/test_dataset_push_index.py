"""The local push index: an unchanged tree is pushed again without reading a file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from datasets_support import random_tree, sdk, write_tree
from factories import Caller
from gpulease.client import GpuleaseClient
from gpulease.client import datasets as client_datasets
from gpulease.client.datasets import PushResult, push_directory
from gpulease.client.push_index import PushIndex, index_path
from gpulease.storage.chunking import CHUNK_SIZE

OLD_NS = 1_600_000_000 * 10**9  # the files' mtime: long before any push


def later_clock() -> int:
    """Hashing happens well after the files last changed (no entry is racily clean)."""
    return time.time_ns() + 60 * 10**9


class Reads:
    """Counts the files the push hashes and the chunks it reads again to send."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.hashed: list[str] = []
        self.chunks_read = 0
        hash_file, read_chunk = client_datasets._hash_file, client_datasets.read_chunk

        def counted_hash(local: client_datasets.LocalFile):  # type: ignore[no-untyped-def]
            self.hashed.append(local.path)
            return hash_file(local)

        def counted_read(path: Path, number: int) -> bytes:
            self.chunks_read += 1
            return read_chunk(path, number)

        monkeypatch.setattr(client_datasets, "_hash_file", counted_hash)
        monkeypatch.setattr(client_datasets, "read_chunk", counted_read)


def manifests(client: GpuleaseClient, monkeypatch: pytest.MonkeyPatch) -> list[list[object]]:
    """The file lists pushes send (what each version is made of), one list per push."""
    sent: list[list[object]] = []
    push_files = client.datasets.push_files

    def spy(name: str, push_id: int, part: int, files: list[tuple[str, int, list[str]]]):  # type: ignore[no-untyped-def]
        if part == 0:
            sent.append([])
        sent[-1].extend(files)
        return push_files(name, push_id, part, files)

    monkeypatch.setattr(client.datasets, "push_files", spy)
    return sent


def age(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, ns=(OLD_NS, OLD_NS))


def push(client: GpuleaseClient, tree: Path, name: str, index: PushIndex) -> PushResult:
    return push_directory(client.datasets, tree, name, index=index, part_files=40)


def test_an_unchanged_tree_is_pushed_again_without_reading_a_file(
    ann: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = sdk(ann)
    random_tree(tmp_path / "imgs", 120, 3000)
    big = bytes(range(256)) * (CHUNK_SIZE // 256) + b"tail"  # two chunks
    write_tree(tmp_path / "imgs", {"big.bin": big, "empty": b""})
    age(tmp_path / "imgs")
    sent = manifests(client, monkeypatch)
    index = PushIndex(tmp_path / "index.sqlite", clock_ns=later_clock)
    first = push(client, tmp_path / "imgs", "imgs", index)
    assert first.index_hits == 0 and not first.unchanged

    # the tree record and the server's manifest digest settle it: no push, no new version
    reads = Reads(monkeypatch)
    again = push(client, tmp_path / "imgs", "imgs", index)
    assert reads.hashed == [] and reads.chunks_read == 0
    assert again.unchanged and again.push_id is None and again.sent_bytes == 0
    assert again.index_hits == again.files == 122 and again.dataset.current_version == 1
    assert len(sent) == 1  # no file list was sent
    assert [v.number for v in client.datasets.get("imgs").versions] == [1]

    # an index opened afresh (the next CLI run) knows the same
    index.close()
    reopened = PushIndex(tmp_path / "index.sqlite", clock_ns=later_clock)
    assert push(client, tmp_path / "imgs", "imgs", reopened).unchanged
    assert reads.hashed == [] and len(sent) == 1

    # a file touched (new mtime, same bytes): hashed again, found equal to v1's, so the push
    # that changes v1 lists nothing and the server keeps the version it had
    os.utime(tmp_path / "imgs" / "empty", ns=(OLD_NS + 10**9, OLD_NS + 10**9))
    touched = push(client, tmp_path / "imgs", "imgs", reopened)
    assert reads.hashed == ["empty"] and touched.sent_bytes == 0
    assert touched.dataset.current_version == 1 and len(sent) == 1
    assert [v.number for v in client.datasets.get("imgs").versions] == [1]
    assert client.datasets.get("imgs").pushes[0].state_reason == "unchanged: the same files as v1"
    assert push(client, tmp_path / "imgs", "imgs", reopened).unchanged
    reopened.close()


def test_a_tree_the_server_no_longer_holds_as_current_is_pushed(
    ann: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = sdk(ann)
    tree = write_tree(tmp_path / "t", {"a.txt": b"alpha"})
    other = write_tree(tmp_path / "o", {"b.txt": b"bravo"})
    age(tree)
    index = PushIndex(tmp_path / "index.sqlite", clock_ns=later_clock)
    push(client, tree, "t", index)
    client.datasets.push(other, "t", use_index=False)  # someone pushed another tree meanwhile
    reads = Reads(monkeypatch)
    sent = manifests(client, monkeypatch)
    back = push(client, tree, "t", index)
    assert not back.unchanged and back.dataset.current_version == 3 and reads.hashed == []
    assert [entry[0] for entry in sent[0]] == ["a.txt"]  # v2 is not the index's: all listed
    assert back.sent_bytes == 0  # its chunks are still on the server
    assert client.datasets.current("t") is not None
    assert client.datasets.current("nothing-here") is None


def test_a_changed_tree_lists_only_what_differs_from_the_version_it_changes(
    ann: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = sdk(ann)
    tree = tmp_path / "imgs"
    random_tree(tree, 60, 2000)
    age(tree)
    index = PushIndex(tmp_path / "index.sqlite", clock_ns=later_clock)
    push(client, tree, "imgs", index)
    gone = sorted(p for p in tree.rglob("*") if p.is_file())[:2]
    for path in gone:
        path.unlink()
    write_tree(tree, {"class_0/new.bin": b"new", "class_1/img_00001.bin": b"rewritten"})
    sent = manifests(client, monkeypatch)
    changed = push(client, tree, "imgs", index)
    assert sorted(entry[0] for entry in sent[0]) == ["class_0/new.bin", "class_1/img_00001.bin"]
    assert changed.dataset.current_version == 2 and changed.files == 59 and changed.sent_chunks == 2

    # the version is the tree: the same manifest as the tree pushed whole, without an index
    whole = client.datasets.push(tree, "whole", use_index=False)
    assert len(sent[-1]) == 59
    assert whole.dataset.file_count == 59 and whole.sent_chunks == 0
    mine, other = client.datasets.current("imgs"), client.datasets.current("whole")
    assert mine is not None and other is not None
    assert mine.manifest_sha256 == other.manifest_sha256
    assert mine.dataset.size_bytes == other.dataset.size_bytes
    # and the index, pruned to the tree, is the base of the next push
    (tree / "class_0" / "new.bin").write_bytes(b"newer")
    assert push(client, tree, "imgs", index).dataset.current_version == 3
    assert [entry[0] for entry in sent[-1]] == ["class_0/new.bin"]

    # a server from before such pushes does not say it takes them: the tree goes whole
    asked = client.datasets.current

    def older_server(name: str):  # type: ignore[no-untyped-def]
        answer = asked(name)
        return None if answer is None else answer.model_copy(update={"changes_taken": False})

    monkeypatch.setattr(client.datasets, "current", older_server)
    (tree / "class_0" / "new.bin").write_bytes(b"newest")
    assert push(client, tree, "imgs", index).dataset.current_version == 4
    assert len(sent[-1]) == 59
    index.close()


def test_a_file_changed_in_place_with_the_same_size_is_hashed_again(
    ann: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = sdk(ann)
    tree = write_tree(tmp_path / "t", {"a.txt": b"alpha", "b.txt": b"bravo"})
    age(tree)
    index = PushIndex(tmp_path / "index.sqlite", clock_ns=later_clock)
    push(client, tree, "t", index)
    (tree / "a.txt").write_bytes(b"ALPHA")  # same size, new mtime
    reads = Reads(monkeypatch)
    changed = push(client, tree, "t", index)
    assert reads.hashed == ["a.txt"]
    assert changed.index_hits == 1 and changed.sent_bytes == 5


def test_a_file_modified_just_before_it_was_hashed_is_not_trusted(
    ann: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = sdk(ann)
    tree = write_tree(tmp_path / "t", {"a.txt": b"alpha"})  # mtime: now
    index = PushIndex(tmp_path / "index.sqlite")  # the real clock: hashed within a second
    push(client, tree, "t", index)
    reads = Reads(monkeypatch)
    assert push(client, tree, "t", index).index_hits == 0
    assert reads.hashed == ["a.txt"]


def test_chunks_the_server_lacks_are_read_again_and_sent(
    ann: Caller, bob: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = random_tree(tmp_path / "imgs", 30, 2000)
    age(tmp_path / "imgs")
    index = PushIndex(tmp_path / "index.sqlite", clock_ns=later_clock)
    push(sdk(ann), tmp_path / "imgs", "imgs", index)
    reads = Reads(monkeypatch)
    # bob's storage holds none of ann's chunks: the index spares the hashing, not the sending
    theirs = push(sdk(bob), tmp_path / "imgs", "imgs", index)
    assert theirs.index_hits == 30 and reads.hashed == []
    assert theirs.sent_bytes == sum(len(d) for d in files.values())
    assert reads.chunks_read == 30


def test_a_corrupt_index_means_a_full_hash(
    ann: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = sdk(ann)
    tree = write_tree(tmp_path / "t", {"a.txt": b"alpha", "b.txt": b"bravo"})
    age(tree)
    broken = tmp_path / "index.sqlite"
    broken.write_bytes(b"this is not a database" * 100)
    reads = Reads(monkeypatch)
    first = push(client, tree, "t", PushIndex(broken, clock_ns=later_clock))
    assert first.index_hits == 0 and sorted(reads.hashed) == ["a.txt", "b.txt"]
    second = push(client, tree, "t", PushIndex(broken, clock_ns=later_clock))
    assert second.index_hits == 2  # it was started afresh


def test_the_sdk_keeps_its_index_under_xdg_cache_home(
    ann: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    client = sdk(ann)
    tree = write_tree(tmp_path / "t", {"a.txt": b"alpha", "gone.txt": b"x"})
    client.datasets.push(tree, "cats")
    where = index_path("http://testserver", "cats")
    assert where == tmp_path / "cache" / "gpulease" / "push-index" / "testserver" / "cats.sqlite"
    (tree / "gone.txt").unlink()
    client.datasets.push(tree, "cats")
    remembered = PushIndex(where)
    assert remembered.paths() == {"a.txt"}  # files gone from the tree are forgotten
    remembered.close()
