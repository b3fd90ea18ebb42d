"""Mounted datasets: what a runner materialises, who may fetch what, tampering, key rotation."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from starlette.testclient import TestClient

from datasets_support import (
    forward_to,
    random_tree,
    runner_connection,
    sdk,
    tree_digests,
    write_tree,
)
from factories import Caller, RunnerDouble
from gpulease.backends.base import RunnerSpec
from gpulease.backends.fake import FakeBackend
from gpulease.runner import version_marks
from gpulease.runner.connection import Connection
from gpulease.runner.datasets import (
    DatasetError,
    _file_list,
    _Listing,
    _Tree,
    chunk_aad,
    links_dir,
    materialise,
)
from gpulease.server.db import transaction
from gpulease.server.orm import StorageKey
from gpulease.server.runtime import Runtime
from gpulease.server.services.datasets.keys import finish_rotation, rotate_master_key
from gpulease.storage import file_lists
from gpulease.storage.chunking import CHUNK_SIZE, unpack
from gpulease.storage.crypto import IntegrityError, open_sealed, read_master_key, unwrap_key


def _instance_with(
    caller: Caller, tick: Callable[[], None], backend: FakeBackend, datasets: list[str]
) -> tuple[int, RunnerSpec]:
    r = caller.post("/api/v1/instances", json={"datasets": datasets})  # CPU only
    assert r.status_code == 201, r.text
    instance_id = int(r.json()["id"])
    tick()
    handle = backend.handle_for(instance_id)
    assert handle is not None
    return instance_id, backend.runners[handle].spec


def _materialise(
    http: TestClient, spec: RunnerSpec, cache: Path
) -> tuple[dict[str, Path], list[str]]:
    messages: list[str] = []
    spec = replace(spec, dataset_cache=cache)
    return materialise(spec, runner_connection(http, spec.token), messages.append), messages


def _version_path(runner: RunnerDouble) -> str:
    """The runner's calls for the one version its instance mounts start with this."""
    (mount,) = runner.call("GET", "/datasets").json()["datasets"]
    return f"/datasets/{mount['dataset_id']}/versions/{mount['version']}"


@pytest.fixture
def pushed(ann: Caller, tmp_path: Path) -> dict[str, str]:
    """ann's dataset 'imgs': small files in folders, an empty file, a three-chunk file."""
    random_tree(tmp_path / "imgs", 120, 3000)
    write_tree(
        tmp_path / "imgs",
        {"empty.txt": b"", "deep/a/b/big.bin": hashlib.sha256(b"x").digest() * (CHUNK_SIZE // 16)},
    )
    sdk(ann).datasets.push(tmp_path / "imgs", "imgs")
    return tree_digests(tmp_path / "imgs")


def test_runner_materialises_every_file_read_only(
    ann: Caller,
    http: TestClient,
    tick: Callable[[], None],
    backend: FakeBackend,
    pushed: dict[str, str],
    tmp_path: Path,
) -> None:
    _, spec = _instance_with(ann, tick, backend, ["imgs"])
    found, messages = _materialise(http, spec, tmp_path / "cache")
    (directory,) = found.values()
    assert found.keys() == {"imgs"} and directory.parent == tmp_path / "cache"
    assert directory.name.endswith("-v1")
    assert tree_digests(directory) == pushed
    assert stat.S_IMODE((directory / "empty.txt").stat().st_mode) == 0o444
    assert stat.S_IMODE((directory / "deep" / "a").stat().st_mode) == 0o555
    assert (links_dir(spec) / "imgs").resolve() == directory
    assert any("fetching dataset imgs v1" in m for m in messages)

    # a second instance on the node shares the materialised version
    _, other = _instance_with(ann, tick, backend, ["imgs"])
    again, messages = _materialise(http, other, tmp_path / "cache")
    assert again == found and not any("fetching" in m for m in messages)
    # an instance without datasets materialises nothing
    _, bare = _instance_with(ann, tick, backend, [])
    assert _materialise(http, bare, tmp_path / "cache")[0] == {}


def test_a_new_push_is_a_new_version_and_old_instances_keep_theirs(
    ann: Caller,
    http: TestClient,
    tick: Callable[[], None],
    backend: FakeBackend,
    pushed: dict[str, str],
    tmp_path: Path,
) -> None:
    _, old = _instance_with(ann, tick, backend, ["imgs"])
    (tmp_path / "imgs" / "new.txt").write_bytes(b"new file")
    sdk(ann).datasets.push(tmp_path / "imgs", "imgs")
    _, new = _instance_with(ann, tick, backend, ["imgs"])
    old_dir = _materialise(http, old, tmp_path / "cache")[0]["imgs"]
    new_dir = _materialise(http, new, tmp_path / "cache")[0]["imgs"]
    assert old_dir.name.endswith("-v1") and new_dir.name.endswith("-v2")
    assert "new.txt" not in tree_digests(old_dir) and "new.txt" in tree_digests(new_dir)


def test_runners_fetch_only_what_their_instance_mounts(
    ann: Caller,
    bob: Caller,
    http: TestClient,
    tick: Callable[[], None],
    backend: FakeBackend,
    pushed: dict[str, str],
) -> None:
    _, ann_spec = _instance_with(ann, tick, backend, ["imgs"])
    ann_runner = RunnerDouble(http, ann_spec.token)
    manifest, chunks = (
        _version_path(ann_runner) + "/manifest",
        _version_path(ann_runner) + "/chunks",
    )
    listed = ann_runner.call("GET", manifest)
    assert listed.status_code == 200 and listed.headers["content-type"] == file_lists.MEDIA_TYPE
    reader = file_lists.Reader()
    blocks = reader.feed(listed.content)
    assert reader.ended and reader.total == reader.files == len(pushed)
    some = blocks[0].digests[: file_lists.DIGEST_BYTES].hex()

    _, bob_spec = _instance_with(bob, tick, backend, [])
    bob_runner = RunnerDouble(http, bob_spec.token)
    assert bob_runner.call("GET", "/datasets").json() == {"datasets": []}
    assert bob_runner.call("GET", manifest).status_code == 404
    assert bob_runner.call("POST", chunks, json={"chunks": [some]}).status_code == 404
    # ann's own runner may not ask for chunks outside the mounted version
    other = hashlib.sha256(b"not in it").hexdigest()
    r = ann_runner.call("POST", chunks, json={"chunks": [other]})
    assert r.status_code == 404 and "not part of this dataset version" in r.json()["detail"]
    assert RunnerDouble(http, "made-up").call("GET", "/datasets").status_code == 401


def test_a_tampered_chunk_fails_the_materialisation(
    ann: Caller,
    http: TestClient,
    rt: Runtime,
    tick: Callable[[], None],
    backend: FakeBackend,
    pushed: dict[str, str],
    tmp_path: Path,
) -> None:
    assert rt.vault is not None
    store = rt.vault.store
    victim = next(key for key in store.iterate("p/"))  # a pack of sealed chunks
    sealed = bytearray(store.get(victim))
    sealed[len(sealed) // 2] ^= 0x01  # flip one bit
    store.put(victim, bytes(sealed))
    _, spec = _instance_with(ann, tick, backend, ["imgs"])
    with pytest.raises(DatasetError, match="failed its integrity check .AES-GCM tag mismatch"):
        _materialise(http, spec, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == [tmp_path / "cache" / ".locks"]  # no half


def test_master_key_rotation_keeps_data_readable(
    ann: Caller,
    http: TestClient,
    rt: Runtime,
    tick: Callable[[], None],
    backend: FakeBackend,
    pushed: dict[str, str],
    tmp_path: Path,
) -> None:
    path = rt.settings.master_key_path
    old = read_master_key(path)
    rotation = rotate_master_key(rt.sessions, path)
    assert rotation.old_key_id == old.key_id and rotation.rewrapped >= 3  # master, user, dataset
    new = read_master_key(path)
    assert new.key_id == rotation.new_key_id != old.key_id
    assert not path.with_name("master.key.new").exists()
    with transaction(rt.sessions) as session:
        rows = list(session.scalars(select(StorageKey)))
    assert {row.master_key_id for row in rows} == {new.key_id}
    for row in rows:
        unwrap_key(new.secret, row.wrapped, row.scope)
        with pytest.raises(IntegrityError, match="integrity check"):
            unwrap_key(old.secret, row.wrapped, row.scope)  # the old key opens nothing now
    # the running server picks the new key up by itself, and everything reads as before
    _, spec = _instance_with(ann, tick, backend, ["imgs"])
    assert tree_digests(_materialise(http, spec, tmp_path / "cache")[0]["imgs"]) == pushed
    (tmp_path / "imgs" / "more.txt").write_bytes(b"after the rotation")
    assert sdk(ann).datasets.push(tmp_path / "imgs", "imgs").sent_bytes == 18


def test_interrupted_rotations_are_settled_at_start(rt: Runtime, pushed: dict[str, str]) -> None:
    path = rt.settings.master_key_path
    pending = path.with_name("master.key.new")
    current = read_master_key(path)
    # a rotation that died before its commit: the pending key is dropped
    pending.write_text("11" * 32 + "\n")
    pending.chmod(0o600)
    ring = finish_rotation(rt.sessions, path)
    assert ring.current.key_id == current.key_id and not pending.exists()
    # one that died after its commit, before replacing the file: the pending key wins
    rotate_master_key(rt.sessions, path)
    rotated = path.read_text()
    path.write_text(current.secret.hex() + "\n")  # the old file is still in place
    pending.write_text(rotated)
    pending.chmod(0o600)
    ring = finish_rotation(rt.sessions, path)
    assert ring.current.key_id != current.key_id and path.read_text() == rotated


def test_a_wrong_master_key_file_is_refused(rt: Runtime, pushed: dict[str, str]) -> None:
    from gpulease.storage.crypto import KeyFileError

    other = rt.settings.home / "other.key"
    other.write_text("22" * 32 + "\n")
    other.chmod(0o600)
    with pytest.raises(KeyFileError, match="does not match this database"):
        finish_rotation(rt.sessions, other)


def test_instances_starting_together_fetch_a_version_once(
    ann: Caller,
    http: TestClient,
    tick: Callable[[], None],
    backend: FakeBackend,
    pushed: dict[str, str],
    tmp_path: Path,
) -> None:
    specs = [_instance_with(ann, tick, backend, ["imgs"])[1] for _ in range(3)]
    results: list[tuple[dict[str, Path], list[str]]] = []
    errors: list[BaseException] = []

    def start(spec: RunnerSpec) -> None:
        try:
            results.append(_materialise(http, spec, tmp_path / "cache"))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(spec,)) for spec in specs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len({found["imgs"] for found, _ in results}) == 1
    fetched = [messages for _, messages in results if any("file list" in m for m in messages)]
    assert len(fetched) == 1  # the others waited for it, then used it
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        ".locks",
        ".marks",
        results[0][0]["imgs"].name,
    ]


def _mark(cache: Path, directory: Path) -> str:
    return (cache / ".marks" / directory.name).read_text()


class Syncs:
    """The directories the runner syncs the file system of (the real syncfs runs too); with
    fail set, every sync fails, as when the host goes down before it ends."""

    def __init__(self) -> None:
        self.directories: list[str] = []
        self.fail = False


@pytest.fixture
def mounting(
    ann: Caller, tick: Callable[[], None], backend: FakeBackend, pushed: dict[str, str]
) -> RunnerSpec:
    """The spec of ann's instance mounting 'imgs'."""
    return _instance_with(ann, tick, backend, ["imgs"])[1]


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Syncs]:
    found = Syncs()
    real = version_marks.syncfs

    def recording(fd: int) -> None:
        found.directories.append(os.readlink(f"/proc/self/fd/{fd}"))
        if found.fail:
            raise OSError(5, "the host went down before the sync ended")
        real(fd)

    monkeypatch.setattr(version_marks, "syncfs", recording)
    yield found
    version_marks.wait_for_syncs()


def test_a_version_is_synced_to_the_disk_after_its_rename_and_marked_so(
    http: TestClient,
    mounting: RunnerSpec,
    tmp_path: Path,
    syncs: Syncs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = tmp_path / "cache"
    in_place_when_marked: list[bool] = []
    mark_built = version_marks.mark_built

    def marking(root: Path, version: str) -> None:
        in_place_when_marked.append((root / version).exists())
        mark_built(root, version)

    monkeypatch.setattr(version_marks, "mark_built", marking)
    directory = _materialise(http, mounting, cache)[0]["imgs"]
    version_marks.wait_for_syncs()
    assert syncs.directories == [str(directory)] and _mark(cache, directory) == "synced\n"
    # the mark was on the disk before the version was in place: a version in place that
    # the host went down on has a mark that says so
    assert in_place_when_marked == [False]

    # a synced version is used as it is, with no sync again
    again, messages = _materialise(http, mounting, cache)
    version_marks.wait_for_syncs()
    assert again["imgs"] == directory and not any("fetching" in m for m in messages)
    assert syncs.directories == [str(directory)]

    # a version materialised before marks were kept is used as it was, and synced now
    (cache / ".marks" / directory.name).unlink()
    again, messages = _materialise(http, mounting, cache)
    assert again["imgs"] == directory and not any("fetching" in m for m in messages)
    version_marks.wait_for_syncs()
    assert syncs.directories == [str(directory)] * 2 and _mark(cache, directory) == "synced\n"


def test_a_version_not_synced_is_used_in_its_boot_and_fetched_again_after_a_restart(
    http: TestClient, mounting: RunnerSpec, pushed: dict[str, str], tmp_path: Path, syncs: Syncs
) -> None:
    """A version whose sync did not end is used in the boot that built it, and synced again;
    built in an earlier boot and never synced, or with a mark that is not the runner's, its
    files may be short or empty on the disk, so it is fetched again, whole."""
    cache = tmp_path / "cache"
    syncs.fail = True
    directory = _materialise(http, mounting, cache)[0]["imgs"]
    version_marks.wait_for_syncs()
    assert _mark(cache, directory) == f"built {version_marks.boot_id()}\n"
    syncs.fail = False
    again, messages = _materialise(http, mounting, cache)
    assert again["imgs"] == directory and not any("fetching" in m for m in messages)
    version_marks.wait_for_syncs()
    assert syncs.directories == [str(directory)] * 2 and _mark(cache, directory) == "synced\n"

    victim = directory / "deep" / "a" / "b" / "big.bin"

    def host_went_down(mark: str) -> None:
        marks = cache / ".marks"
        (marks / directory.name).unlink()
        (marks / directory.name).write_text(mark)
        victim.parent.chmod(0o755)
        victim.unlink()  # what the disk never got
        victim.write_bytes(b"")
        victim.parent.chmod(0o555)

    for mark in ("built 7e0b7c3e-the-boot-before\n", "synced but torn", ""):
        host_went_down(mark)
        again, messages = _materialise(http, mounting, cache)
        version_marks.wait_for_syncs()
        assert again["imgs"] == directory and tree_digests(directory) == pushed, mark
        assert any("before this host restarted" in m for m in messages), mark
        assert any("fetching dataset imgs v1" in m for m in messages), mark
        assert _mark(cache, directory) == "synced\n"
        assert sorted(p.name for p in cache.iterdir()) == [".locks", ".marks", directory.name]

    # a mark that is a link is not followed: the version is fetched again
    (cache / ".marks" / directory.name).unlink()
    (cache / ".marks" / directory.name).symlink_to(cache / ".marks" / "elsewhere")
    (cache / ".marks" / "elsewhere").write_text("synced\n")
    messages = _materialise(http, mounting, cache)[1]
    assert any("before this host restarted" in m for m in messages)
    version_marks.wait_for_syncs()
    assert not (cache / ".marks" / directory.name).is_symlink()
    assert _mark(cache, directory) == "synced\n"


@pytest.fixture
def small_fetches(
    ann: Caller,
    tick: Callable[[], None],
    backend: FakeBackend,
    pushed: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> RunnerSpec:
    """The spec of ann's instance mounting 'imgs', its runner fetching 7 chunks a request
    (about 18 requests, two on their way at once)."""
    monkeypatch.setattr("gpulease.runner.datasets.FETCH_CHUNKS", 7)
    _, spec = _instance_with(ann, tick, backend, ["imgs"])
    return replace(spec, dataset_cache=tmp_path / "cache")


def test_a_version_fetched_in_many_requests_at_once_is_whole_and_read_only(
    http: TestClient, small_fetches: RunnerSpec, pushed: dict[str, str]
) -> None:
    found = materialise(small_fetches, runner_connection(http, small_fetches.token), lambda m: None)
    directory = found["imgs"]
    assert tree_digests(directory) == pushed
    folders = [Path(d) for d, _, _ in os.walk(directory)]
    assert len(folders) > 3  # deep, deep/a and deep/a/b among them
    assert all(stat.S_IMODE(d.stat().st_mode) == 0o555 for d in folders)


def test_the_first_requests_ask_for_fewer_chunks_doubling_up_to_the_most(
    http: TestClient,
    small_fetches: RunnerSpec,
    pushed: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("gpulease.runner.datasets.FIRST_FETCH_CHUNKS", 2)
    batches: list[int] = []
    real_add = _Listing.add

    def add(
        listing: _Listing, block: file_lists.Block
    ) -> list[list[tuple[int, int, str, bytes, int]]]:
        full = real_add(listing, block)
        batches.extend(len(batch) for batch in full)
        return full

    monkeypatch.setattr(_Listing, "add", add)
    found = materialise(small_fetches, runner_connection(http, small_fetches.token), lambda m: None)
    assert tree_digests(found["imgs"]) == pushed
    assert len(batches) > 4
    for number, pieces in enumerate(batches):
        most = min(2 << number, 7)
        assert pieces in (most, most + 1), batches  # one more: an empty file's piece


def test_a_request_failing_among_several_in_flight_leaves_nothing_half_made(
    http: TestClient, small_fetches: RunnerSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection = runner_connection(http, small_fetches.token)
    real = connection.call
    calls = []

    def third_fails(method: str, path: str, **kwargs: object) -> object:
        if path.endswith("/chunks"):
            calls.append(path)
            if len(calls) == 3:
                kwargs["json"] = {"chunks": ["not a chunk"]}
        return real(method, path, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(connection, "call", third_fails)
    with pytest.raises(DatasetError, match="fetching dataset imgs v1: the server answered HTTP 4"):
        materialise(small_fetches, connection, lambda message: None)
    cache = small_fetches.dataset_cache
    assert cache is not None and list(cache.iterdir()) == [cache / ".locks"]


def test_a_file_in_several_requests_is_written_whole_from_their_threads(
    http: TestClient,
    small_fetches: RunnerSpec,
    pushed: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # every chunk its own request: the two-chunk file comes in two, written side by side
    monkeypatch.setattr("gpulease.runner.datasets.FETCH_BYTES", 1)
    found = materialise(small_fetches, runner_connection(http, small_fetches.token), lambda m: None)
    assert tree_digests(found["imgs"]) == pushed
    assert stat.S_IMODE((found["imgs"] / "deep" / "a" / "b" / "big.bin").stat().st_mode) == 0o444


def _block(files: list[tuple[str, int, list[str]]]) -> file_lists.Block:
    """A block of a file list; each chunk named by a letter, its key that letter repeated."""
    names = [name for _, _, chunks in files for name in chunks]
    return file_lists.Block(
        [path for path, _, _ in files],
        tuple(size for _, size, _ in files),
        tuple(len(chunks) for _, _, chunks in files),
        b"".join(name.encode() * file_lists.DIGEST_BYTES for name in names),
        b"".join(name.encode() * file_lists.KEY_BYTES for name in names),
    )


def test_the_listing_cuts_batches_and_counts_the_requests_a_file_spans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpulease.runner.datasets.FETCH_CHUNKS", 2)
    tree = _Tree(tmp_path)
    listing = _Listing(tree, "dataset d v1")
    first = listing.add(_block([("a", 1, ["a"]), ("x/b", 3 * CHUNK_SIZE, ["b", "c", "d"])]))
    rest = listing.add(_block([("x/y/c", 0, []), ("z/d", 1, ["e"])])) + listing.finish()
    tree.close()
    hexed = {bytes([n]).hex() * file_lists.DIGEST_BYTES: chr(n) for n in b"abcde"}
    assert [
        [(i, offset // CHUNK_SIZE, hexed.get(sha, "")) for i, offset, sha, _, _ in b]
        for b in first + rest
    ] == [
        [(0, 0, "a"), (1, 0, "b")],
        [(1, 1, "c"), (1, 2, "d"), (2, 0, "")],  # an empty file asks for no chunk
        [(3, 0, "e")],
    ]
    assert tree._left == {1: 2}
    assert tree.paths == ["a", "x/b", "x/y/c", "z/d"]
    assert tree.directories == ["x", "x/y", "z"]  # made as they were listed, parents first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x", "z"]


@pytest.mark.parametrize(
    ("paths", "problem"),
    [
        (["a", "a"], "'a' is listed twice, or as a file and a directory"),
        (["a/b", "a"], "'a' is listed twice, or as a file and a directory"),
        (["a", "a/b/c"], "'a' is a file and also a directory holding 'a/b/c'"),
        (["ok", "../up"], "lists the path '../up', which is refused: it points outside"),
        (["ok", "b/./c"], "which is refused: it has an empty or '.' part"),
    ],
)
def test_a_file_list_that_is_no_tree_is_refused(
    paths: list[str], problem: str, tmp_path: Path
) -> None:
    tree = _Tree(tmp_path)
    listing = _Listing(tree, "dataset d v1")
    try:
        with pytest.raises(DatasetError, match=re.escape(problem)):
            for path in paths:
                listing.add(_block([(path, 0, [])]))
    finally:
        tree.close()


def test_a_broken_or_malformed_file_list_is_refused() -> None:
    good = file_lists.header(1, 0) + file_lists.block(["a"], [0], [0], b"", b"")
    reader = file_lists.Reader()
    assert reader.feed(good[:7]) == [] and reader.feed(good[7:-1]) == []
    (block,) = reader.feed(good[-1:])
    assert block.paths == ["a"] and not reader.ended
    assert reader.feed(file_lists.END) == [] and reader.ended and reader.files == 1
    with pytest.raises(file_lists.FileListError, match="after the end"):
        reader.feed(b"x")
    for body, problem in [
        (b"GLF0" + good[4:], "wrong format"),
        (
            file_lists.header(1, 0) + file_lists.block(["a"], [1], [1], b"", b""),
            "have 1 chunks, not 0",
        ),
        (file_lists.header(1, 0) + file_lists.block(["a\0b"], [0], [0], b"", b""), "names 2"),
        (good + file_lists.END + b"more", "after the end"),
    ]:
        with pytest.raises(file_lists.FileListError, match=problem):
            file_lists.Reader().feed(body)


class _BreaksOnce(httpx.SyncByteStream):
    """A body that breaks off (a read error) after its first `keep` bytes."""

    def __init__(self, body: bytes, keep: int) -> None:
        self.body, self.keep = body, keep

    def __iter__(self) -> Iterator[bytes]:
        yield self.body[: self.keep]
        raise httpx.ReadError("the server went away")


def test_a_file_list_that_breaks_off_is_asked_for_again_from_where_it_broke(
    http: TestClient,
    small_fetches: RunnerSpec,
    pushed: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        "gpulease.server.services.datasets.mounts.FILE_LIST_BLOCK_FILES", 50
    )  # three blocks; the first answer breaks off in the second
    starts: list[str] = []

    def forward(request: httpx.Request) -> httpx.Response:
        answer = forward_to(http, request)
        if request.url.path.endswith("/manifest"):
            starts.append(request.url.params["start"])
            if len(starts) == 1:  # the server is not up yet
                return httpx.Response(503, text="starting")
            if len(starts) == 2:
                stream = _BreaksOnce(answer.content, len(answer.content) // 2)
                return httpx.Response(answer.status_code, headers=answer.headers, stream=stream)
        return answer

    connection = Connection(
        "http://testserver",
        small_fetches.token,
        on_stop=lambda reason: None,
        transport=httpx.MockTransport(forward),
        backoff_start_s=0.01,
    )
    found = materialise(small_fetches, connection, lambda message: None)
    assert tree_digests(found["imgs"]) == pushed
    assert starts == ["0", "0", "50"]  # the first block came whole, the second did not


def test_a_file_list_asked_for_past_its_end_is_refused(
    ann: Caller,
    http: TestClient,
    tick: Callable[[], None],
    backend: FakeBackend,
    pushed: dict[str, str],
) -> None:
    _, spec = _instance_with(ann, tick, backend, ["imgs"])
    runner = RunnerDouble(http, spec.token)
    manifest = _version_path(runner) + "/manifest"
    last = runner.call("GET", manifest, params={"start": len(pushed)})
    reader = file_lists.Reader()
    assert reader.feed(last.content) == [] and reader.ended and reader.start == len(pushed)
    r = runner.call("GET", manifest, params={"start": len(pushed) + 1})
    assert r.status_code == 422 and f"past the {len(pushed)} files" in r.json()["detail"]
    assert runner.call("GET", manifest, params={"start": -1}).status_code == 422


def test_chunks_asked_for_out_of_order_and_with_gaps_come_whole_in_the_order_asked(
    ann: Caller,
    http: TestClient,
    tick: Callable[[], None],
    backend: FakeBackend,
    pushed: dict[str, str],
) -> None:
    _, spec = _instance_with(ann, tick, backend, ["imgs"])
    runner = RunnerDouble(http, spec.token)
    reader = file_lists.Reader()
    (block,) = reader.feed(runner.call("GET", _version_path(runner) + "/manifest").content)
    step = file_lists.DIGEST_BYTES
    keys = {
        block.digests[at : at + step].hex(): block.keys[at : at + step]
        for at in range(0, len(block.digests), step)
    }
    every = list(keys)
    wanted = every[::-3] + every[1:4]  # backwards with gaps, then three side by side
    answer = runner.call("POST", _version_path(runner) + "/chunks", json={"chunks": wanted})
    assert answer.status_code == 200
    records = list(unpack(answer.content))
    assert [sha for sha, _ in records] == wanted
    owner = int(runner.call("GET", "/datasets").json()["datasets"][0]["owner_id"])
    for sha, sealed in records:
        plain = open_sealed(keys[sha], sealed, chunk_aad(owner, sha), sha)
        assert hashlib.sha256(plain).hexdigest() == sha


def _answering(*bodies: bytes) -> Connection:
    """A runner Connection whose calls get these bodies in turn (200), the last one after."""
    left = list(bodies)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=left.pop(0) if len(left) > 1 else left[0])

    return Connection(
        "http://testserver", "t", on_stop=lambda reason: None, transport=httpx.MockTransport(answer)
    )


def test_an_empty_file_list_is_read_and_one_that_starts_over_is_refused() -> None:
    empty = _answering(file_lists.header(0, 0) + file_lists.END)
    assert list(_file_list(empty, "/list", "dataset d v1")) == []
    one = file_lists.block(["a"], [0], [0], b"", b"")
    broken = file_lists.header(2, 0) + one  # breaks off after "a"
    again = file_lists.header(2, 0) + one + one + file_lists.END  # from 0, not from 1
    blocks = _file_list(_answering(broken, again), "/list", "dataset d v1")
    assert next(blocks).paths == ["a"]
    with pytest.raises(DatasetError, match="does not go on where it broke off"):
        next(blocks)
