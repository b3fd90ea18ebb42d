"""Datasets over the API: push, dedup, resume, versions, removal, quota, isolation."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import select
from starlette.testclient import TestClient

from datasets_support import random_tree, sdk, tree_digests, write_tree
from factories import Caller
from gpulease.client import ApiError, PushProgress
from gpulease.client.datasets import push_directory
from gpulease.core.datasets import manifest_digest
from gpulease.server.db import transaction
from gpulease.server.orm import DatasetChunk, StorageKey, User
from gpulease.server.runtime import Runtime
from gpulease.server.services.datasets import quota
from gpulease.server.services.datasets.bulk import execute_rows
from gpulease.storage.chunking import CHUNK_SIZE, pack


class Interrupt(PushProgress):
    """Stops a push (as Ctrl-C would) once `after` bytes are done."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.done = 0

    def started(self, files: int, size: int) -> None:
        pass

    def advanced(self, files: int, size: int) -> None:
        self.done += size
        if self.done >= self.after:
            raise KeyboardInterrupt


def test_push_versions_and_dedup(ann: Caller, tmp_path: Path) -> None:
    client = sdk(ann)
    big = bytes(range(256)) * (CHUNK_SIZE // 256) + b"tail"  # two chunks
    tree = write_tree(
        tmp_path / "cats",
        {
            "a.txt": b"alpha",
            "same/a.txt": b"alpha",  # the same content: stored once
            "empty": b"",
            "deep/er/big.bin": big,
        },
    )
    first = client.datasets.push(tree, "cats")
    assert first.dataset.current_version == 1 and first.dataset.file_count == 4
    assert first.sent_chunks == 3 and first.sent_bytes == 5 + len(big)
    listing = client.datasets.list()
    assert [d.name for d in listing.datasets] == ["cats"]
    assert listing.usage.used_bytes == 5 + len(big)

    # unchanged (and just written, so the push index does not vouch for it yet): hashed,
    # nothing sent, and the server keeps the version it has
    again = client.datasets.push(tree, "cats")
    assert again.dataset.current_version == 1 and again.sent_bytes == 0

    (tree / "a.txt").write_bytes(b"beta!")
    third = client.datasets.push(tree, "cats")
    assert third.sent_chunks == 1 and third.sent_bytes == 5
    detail = client.datasets.get("cats")
    assert [v.number for v in detail.versions] == [2, 1]
    assert detail.pushes[0].bytes_received == 5 and detail.pushes[0].state == "committed"

    # another dataset of the same user shares the chunks (dedup across datasets)
    other = client.datasets.push(tree, "cats-copy")
    assert other.sent_bytes == 0


def test_interrupted_push_resumes_with_only_the_rest(ann: Caller, tmp_path: Path) -> None:
    client = sdk(ann)
    files = random_tree(tmp_path / "imgs", 300, 10_000)
    total = sum(len(d) for d in files.values())
    with pytest.raises(KeyboardInterrupt):
        push_directory(
            client.datasets,
            tmp_path / "imgs",
            "imgs",
            progress=Interrupt(total // 3),
            part_files=50,
            pack_bytes=64_000,
            threads=1,
        )
    # nothing is visible yet
    assert client.datasets.list().datasets == []
    with pytest.raises(ApiError) as missing:
        client.datasets.get("imgs")
    assert missing.value.status == 404

    second = client.datasets.push(tmp_path / "imgs", "imgs")
    pushes = client.datasets.get("imgs").pushes
    first_push = next(p for p in pushes if p.id != second.push_id)
    assert first_push.state == "abandoned" and first_push.bytes_received > 0
    unique = {hashlib.sha256(d).hexdigest(): len(d) for d in files.values()}
    assert first_push.bytes_received + second.sent_bytes == sum(unique.values())
    assert 0 < second.sent_bytes < sum(unique.values())
    assert second.dataset.file_count == 300 and second.dataset.size_bytes == total


def _start(caller: Caller, name: str, files: int, size: int) -> int:
    r = caller.post(
        f"/api/v1/datasets/{name}/pushes", json={"name": name, "files": files, "bytes": size}
    )
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


BAD_PATHS = [
    ("../etc/passwd", "outside the dataset"),
    ("a/../../b", "outside the dataset"),
    ("/etc/passwd", "absolute"),
    ("bad\x01name", "control character"),
    ("line\nbreak", "control character"),
    ("a/./b", "'.' part"),
    ("a//b", "empty"),
    ("back\\slash", "\\"),
]


def test_server_refuses_bad_paths(ann: Caller) -> None:
    """The CLI refuses these too; the server must not rely on it."""
    push = _start(ann, "bad", 1, 1)
    sha = hashlib.sha256(b"x").hexdigest()
    for path, words in BAD_PATHS:
        r = ann.put(
            f"/api/v1/datasets/bad/pushes/{push}/files/0",
            json={"files": [{"path": path, "size": 1, "chunks": [sha]}]},
        )
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert words in detail and "refused file path" in detail, (path, detail)
    assert ann.get("/api/v1/datasets").json()["datasets"] == []


def test_server_refuses_bad_names_and_inconsistent_lists(ann: Caller) -> None:
    for name in ("Cats", "9lives", "a" * 65, "with space", "x\x00"):
        url = f"/api/v1/datasets/{quote(name, safe='')}/pushes"
        r = ann.post(url, json={"name": name, "files": 0, "bytes": 0})
        assert r.status_code == 422 and "not a valid dataset name" in r.text, r.text
    push = _start(ann, "set", 2, 3)
    sha = hashlib.sha256(b"abc").hexdigest()
    url = f"/api/v1/datasets/set/pushes/{push}"
    r = ann.put(f"{url}/files/0", json={"files": [{"path": "a", "size": 3, "chunks": []}]})
    assert r.status_code == 422 and "chunks" in r.json()["detail"]
    r = ann.put(
        f"{url}/files/0",
        json={
            "files": [
                {"path": "a", "size": 3, "chunks": [sha]},
                {"path": "a/b", "size": 0, "chunks": []},
            ]
        },
    )
    assert r.status_code == 200 and r.json()["missing"] == [sha]
    # a chunk whose bytes do not match its hash is refused
    r = ann.post(f"{url}/chunks", content=pack([(sha, b"abd")]))
    assert r.status_code == 422 and "hash to" in r.json()["detail"]
    # commit before the chunks: refused, nothing visible
    r = ann.post(f"{url}/commit", json={"parts": 1, "files": 2, "bytes": 3})
    assert r.status_code == 422 and "directory tree" in r.json()["detail"]
    assert ann.get("/api/v1/datasets").json()["datasets"] == []
    r = ann.put(f"{url}/files/0", json={"files": [{"path": "a", "size": 3, "chunks": [sha]}]})
    r = ann.post(f"{url}/commit", json={"parts": 1, "files": 1, "bytes": 3})
    assert r.status_code == 409 and "have not arrived" in r.json()["detail"]
    r = ann.post(f"{url}/chunks", content=pack([(sha, b"abc")]))
    assert r.status_code == 200 and r.json() == {"chunks": 1, "bytes": 3, "new_chunks": 1}
    r = ann.post(f"{url}/commit", json={"parts": 1, "files": 1, "bytes": 3})
    assert r.status_code == 201 and r.json()["current_version"] == 1
    # a malformed pack
    push = _start(ann, "set", 1, 3)
    r = ann.post(f"/api/v1/datasets/set/pushes/{push}/chunks", content=b"\x00" * 10)
    assert r.status_code == 422 and "malformed chunk pack" in r.json()["detail"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_push_that_changes_a_version_lists_only_what_changed(
    ann: Caller, bob: Caller, tmp_path: Path
) -> None:
    client = sdk(ann)
    v1 = {"a.txt": b"alpha", "b.txt": b"bravo", "d/c.txt": b"charlie"}
    client.datasets.push(write_tree(tmp_path / "v1", v1), "set")
    # v2: a.txt changed, e.txt new, b.txt removed; d/c.txt is v1's, not listed
    push = _start(ann, "set", 3, 17)
    url = f"/api/v1/datasets/set/pushes/{push}"
    changes = [("a.txt", b"ALPHA!"), ("e.txt", b"echo")]
    files = [{"path": p, "size": len(d), "chunks": [_sha(d)]} for p, d in changes]
    r = ann.put(f"{url}/files/0", json={"files": files})
    assert r.status_code == 200
    assert sorted(r.json()["missing"]) == sorted(_sha(d) for _, d in changes)

    def commit(**body: object) -> tuple[int, str]:
        r = ann.post(f"{url}/commit", json={"parts": 1, "files": 3, "bytes": 17} | body)
        return r.status_code, str(r.json().get("detail", ""))

    assert commit(base_version=1, removed=["b.txt"]) == (
        409,
        "2 chunks of this push have not arrived; push again to send them",
    )
    assert ann.post(f"{url}/chunks", content=pack([(_sha(d), d) for _, d in changes])).is_success

    assert commit(base_version=7, removed=["b.txt"]) == (
        422,
        "dataset set has no version 7 to change; push the whole tree (no base version)",
    )
    assert commit(base_version=1, removed=["b.txt", "nope.txt"]) == (
        422,
        "'nope.txt' is not a file of version 1, so it cannot be removed from it",
    )
    assert commit(base_version=1, removed=["a.txt"]) == (
        422,
        "'a.txt' is both listed and removed; send it once",
    )
    status, said = commit(removed=["b.txt"])
    assert status == 422 and "need the base version" in said
    r = ann.put(f"{url}/files/1", json={"files": files[:1]})  # a.txt again, in another part
    assert r.status_code == 200
    status, said = commit(parts=2, base_version=1, removed=["b.txt"])
    assert status == 422 and "'a.txt' is listed twice" in said
    status, said = commit(base_version=1)  # b.txt kept: four files
    assert status == 422 and "the server got 4 files, 22 bytes" in said
    status, said = commit(base_version=0, removed=["b.txt"])
    assert status == 422 and "base_version" in said
    r = bob.post(f"{url}/commit", json={"parts": 1, "files": 3, "bytes": 17, "base_version": 1})
    assert r.status_code == 404  # not his push
    assert client.datasets.current("set").dataset.current_version == 1  # type: ignore[union-attr]

    assert commit(base_version=1, removed=["b.txt"])[0] == 201
    current = client.datasets.current("set")
    assert current is not None and current.dataset.current_version == 2
    assert (current.dataset.file_count, current.dataset.size_bytes) == (3, 17)
    whole = {"a.txt": b"ALPHA!", "d/c.txt": b"charlie", "e.txt": b"echo"}
    assert current.manifest_sha256 == manifest_digest(
        (path, len(data), [_sha(data)]) for path, data in sorted(whole.items())
    )
    assert [v.number for v in client.datasets.get("set").versions] == [2, 1]

    # bob has no version of a 'set' of his own to change
    mine = _start(bob, "set", 1, 5)
    r = bob.put(f"/api/v1/datasets/set/pushes/{mine}/files/0", json={"files": files[:1]})
    assert r.status_code == 200
    r = bob.post(
        f"/api/v1/datasets/set/pushes/{mine}/commit",
        json={"parts": 1, "files": 1, "bytes": 6, "base_version": 1},
    )
    assert r.status_code == 422 and "has no version 1" in r.json()["detail"]


def test_quota(ann: Caller, rt: Runtime, tmp_path: Path) -> None:
    rt.settings.storage_quota_gb = 0.000_100  # 100 kB
    client = sdk(ann)
    huge = write_tree(tmp_path / "huge", {"a.bin": b"a" * 150_000})
    with pytest.raises(ApiError) as refused:
        client.datasets.push(huge, "huge")
    assert refused.value.status == 413
    assert "150 kB" in refused.value.message and "100 kB" in refused.value.message

    first = write_tree(tmp_path / "first", {"a.bin": b"1" * 60_000})
    client.datasets.push(first, "first")
    second = write_tree(tmp_path / "second", {"b.bin": b"2" * 50_000})
    with pytest.raises(ApiError) as over:
        client.datasets.push(second, "second")
    assert over.value.status == 413
    assert "needs 50 kB of new storage but only 40 kB is left" in over.value.message
    assert "you use 60 kB of your 100 kB quota" in over.value.message
    listing = client.datasets.list()
    assert [d.name for d in listing.datasets] == ["first"]  # no partial dataset
    assert listing.usage.used_bytes == 60_000  # the refused push's reservation is gone

    client.datasets.remove("first")
    assert client.datasets.list().usage.used_bytes == 0
    client.datasets.push(second, "second")
    with transaction(rt.sessions) as session:  # the counter moved with the rows throughout
        assert quota.usage(session, 2) == quota.counted_usage(session, 2) == 50_000


def test_remove_frees_only_unshared_chunks(ann: Caller, tmp_path: Path, rt: Runtime) -> None:
    client = sdk(ann)
    one = write_tree(tmp_path / "one", {"shared": b"s" * 1000, "own": b"o" * 2000})
    two = write_tree(tmp_path / "two", {"shared": b"s" * 1000})
    client.datasets.push(one, "one")
    client.datasets.push(two, "two")
    removed = client.datasets.remove("one")
    assert removed.freed_chunks == 1 and removed.freed_bytes == 2000
    assert client.datasets.list().usage.used_bytes == 1000
    with pytest.raises(ApiError) as gone:
        client.datasets.get("one")
    assert gone.value.status == 404
    assert rt.vault is not None
    assert len(list(rt.vault.store.iterate("m/"))) == 1  # its manifest is gone, two's stays
    (pack,) = rt.vault.store.iterate("p/")  # shared with two: the pack stays whole
    with transaction(rt.sessions) as session:  # and the dataset key that sealed it
        scopes = set(session.scalars(select(StorageKey.scope)))
    assert scopes == {"master", "user:2", "dataset:2"}
    again = client.datasets.push(one, "one")  # the name can be used again
    assert again.sent_bytes == 2000
    client.datasets.remove("one")
    client.datasets.remove("two")
    assert list(rt.vault.store.iterate("p/")) == [] and pack


def test_other_users_see_nothing(ann: Caller, bob: Caller, tmp_path: Path) -> None:
    push = sdk(ann).datasets.push(write_tree(tmp_path / "s", {"secret.txt": b"ann only"}), "secret")
    assert bob.get("/api/v1/datasets").json()["datasets"] == []
    assert bob.get("/api/v1/datasets/secret").status_code == 404
    assert bob.delete("/api/v1/datasets/secret").status_code == 404
    assert bob.get(f"/api/v1/datasets/secret/pushes/{push.push_id}").status_code == 404
    r = bob.post(
        f"/api/v1/datasets/secret/pushes/{push.push_id}/commit",
        json={"parts": 0, "files": 0, "bytes": 0},
    )
    assert r.status_code == 404
    r = bob.post("/api/v1/instances", json={"gpu": "T4:1", "datasets": ["secret"]})
    assert r.status_code == 404 and "no dataset 'secret'" in r.json()["detail"]
    assert bob.get("/api/v1/instances").json() == []
    # bob's own push of the same content is not deduplicated against ann's
    mine = sdk(bob).datasets.push(write_tree(tmp_path / "b", {"x.txt": b"ann only"}), "secret")
    assert mine.sent_bytes == len(b"ann only")


def test_rm_refused_while_mounted(ann: Caller, tmp_path: Path, tick) -> None:  # type: ignore[no-untyped-def]
    sdk(ann).datasets.push(write_tree(tmp_path / "d", {"f": b"data"}), "d")
    r = ann.post("/api/v1/instances", json={"gpu": "T4:1", "name": "box", "datasets": ["d"]})
    assert r.status_code == 201, r.text
    assert r.json()["datasets"] == {"d": 1}
    r = ann.delete("/api/v1/datasets/d")
    assert r.status_code == 409 and "box" in r.json()["detail"]
    ann.post("/api/v1/instances/box/release")
    tick()
    assert ann.delete("/api/v1/datasets/d").status_code == 200


def test_unknown_dataset_on_create(ann: Caller, http: TestClient) -> None:
    r = ann.post("/api/v1/instances", json={"gpu": "T4:1", "datasets": ["nope"]})
    assert r.status_code == 404 and "dataset ls" in r.json()["detail"]
    r = ann.post("/api/v1/instances", json={"gpu": "T4:1", "datasets": ["Bad Name"]})
    assert r.status_code == 422
    assert ann.get("/api/v1/instances").json() == []


def test_tree_digest_helper(tmp_path: Path) -> None:
    files = random_tree(tmp_path / "t", 3, 100)
    assert tree_digests(tmp_path / "t") == {
        p: hashlib.sha256(d).hexdigest() for p, d in files.items()
    }


def test_bulk_rows_keep_each_value_when_values_repeat(rt: Runtime, ann: Caller) -> None:
    """execute_rows processes a repeated value once; every row still gets its own value, and
    a naive datetime is still refused."""
    now = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    later = now + timedelta(hours=1)
    sql = (
        "INSERT INTO dataset_chunks (owner_id, sha256, size, key_wrapped, stored, "
        '"offset", length, created_at) VALUES (?, ?, ?, ?, FALSE, 0, 0, ?)'
    )
    columns = ("owner_id", "sha256", "size", "key_wrapped", "created_at")
    with transaction(rt.sessions) as session:
        owner = session.scalar(select(User.id).where(User.name == ann.name))
        assert owner is not None
        times = [now, later, now, now.astimezone(timezone(timedelta(hours=2))), later]
        rows = [(owner, f"{i:064x}", i, b"k", at) for i, at in enumerate(times)]
        execute_rows(session, DatasetChunk.__table__, sql, columns, rows)  # type: ignore[arg-type]
    with transaction(rt.sessions) as session:
        found = session.execute(
            select(DatasetChunk.size, DatasetChunk.created_at).where(DatasetChunk.owner_id == owner)
        ).all()
        assert sorted(found) == [(i, at.astimezone(UTC)) for i, at in enumerate(times)]
        with pytest.raises(ValueError, match="naive datetime"):
            execute_rows(
                session,
                DatasetChunk.__table__,  # type: ignore[arg-type]
                sql,
                columns,
                [
                    (owner, "f" * 64, 1, b"k", now),
                    (owner, "e" * 64, 1, b"k", now.replace(tzinfo=None)),
                ],
            )
