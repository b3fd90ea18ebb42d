"""Workspace moves: a runner saves the workspace at stop, another restores it (real server, real
database, the runner's own workspace_sync code over the runner protocol)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from starlette.testclient import TestClient

from factories import Caller, RunnerDouble, make_running_instance
from gpulease.backends.fake import FakeBackend
from gpulease.client.push_index import FileStat
from gpulease.gpus.discovery import DiscoveredGpu, Inventory
from gpulease.runner import safefs, workspace_sync
from gpulease.runner.agent import Agent
from gpulease.runner.connection import Connection
from gpulease.schemas.runner import RunnerSpec
from gpulease.server.db import transaction
from gpulease.server.orm import Node, StorageKey, StorageMeter, UsageSegment, WorkspaceChunk
from gpulease.server.reconcilers import billing, launcher
from gpulease.server.routers.api.clock import request_time
from gpulease.server.runtime import Runtime
from gpulease.server.services import nodes
from gpulease.storage.chunking import CHUNK_SIZE, pack, unpack

Tick = Callable[[], object]
RunnerFor = Callable[[int], RunnerDouble]


def connection(http: TestClient, runner: RunnerDouble) -> Connection:
    return Connection(
        "http://testserver",
        runner.token,
        on_stop=lambda _: None,
        transport=http._transport,
        backoff_start_s=0.01,
    )


def spec_at(
    backend: FakeBackend, instance_id: int, workspace: Path, **changes: object
) -> RunnerSpec:
    handle = backend.handle_for(instance_id)
    assert handle is not None
    spec = backend.runners[handle].spec
    return replace(spec, workspace=workspace, run_dir=workspace.parent / "run", **changes)  # type: ignore[arg-type]


def blob_keys(rt: Runtime, prefix: str) -> list[str]:
    assert rt.vault is not None
    return list(rt.vault.store.iterate(prefix))


def later() -> int:
    """A save's clock well after the files were written: the node's index may vouch for
    them (a file hashed within push_index.RACY_NS of its last change is read again)."""
    return time.time_ns() + 60 * 10**9


@pytest.fixture
def fleet(backend: FakeBackend) -> FakeBackend:
    backend.same_host = False  # runners on other nodes: workspaces are saved at stop
    return backend


def test_a_workspace_saved_at_stop_is_restored_elsewhere_and_a_second_save_sends_only_changes(
    http: TestClient, ann: Caller, tick: Tick, runner_for: RunnerFor, fleet: FakeBackend,
    rt: Runtime, tmp_path: Path,
) -> None:  # fmt: skip
    instance_id, runner = make_running_instance(ann, tick, runner_for, "box")
    assert fleet.started[-1].workspace_save and not fleet.started[-1].workspace_restore
    old = tmp_path / "node-a" / "ws"
    (old / "src").mkdir(parents=True)
    (old / "src" / "train.py").write_text("print('hi')\n")
    os.chmod(old / "src" / "train.py", 0o755)
    big = os.urandom(CHUNK_SIZE + 1000)  # two chunks
    (old / "weights.bin").write_bytes(big)
    layer = old / ".gpulease" / "venv"
    (layer / "lib").mkdir(parents=True)
    (layer / "lib" / "pkg.py").write_text("installed by pip")
    (layer / "pyvenv.cfg").write_text("home = /node-a/envs/python/bin\n")  # this node's
    (layer / "bin").mkdir()
    (layer / "bin" / "python").symlink_to("/node-a/envs/python/bin/python")
    (old / "empty" / "deeper").mkdir(parents=True)
    (old / "cache").mkdir()
    conn = connection(http, runner)
    spec = spec_at(fleet, instance_id, old)

    first = workspace_sync.save(spec, conn, clock_ns=later)
    assert first is not None and (first.files, first.sent_chunks) == (3, 4)
    assert first.bytes == len(big) + len("print('hi')\n") + len("installed by pip")
    assert first.dirs == 3  # empty/deeper, cache, and the layer's bin (only a link in it)
    (old / "notes.txt").write_text("new")  # one more file, the rest unchanged
    second = workspace_sync.save(spec, conn, clock_ns=later)
    assert second is not None and (second.files, second.sent_chunks) == (4, 1)
    assert second.read_files == 1  # the others: the node's index vouched for them
    shown = ann.get("/api/v1/instances/box").json()
    assert shown["workspace_saved_at"] is not None and shown["last_node"] is not None

    # stored sealed: no pack holds the plaintext
    assert rt.vault is not None
    packs = blob_keys(rt, "w/")
    assert packs and all(big[:4096] not in rt.vault.store.get(k) for k in packs)

    new = tmp_path / "node-b" / "ws"
    (new / "old-stale").mkdir(parents=True)
    (new / "old-stale" / "gone.txt").write_text("from an older copy on this node")
    restored = workspace_sync.restore(
        spec_at(fleet, instance_id, new, workspace_restore=True), conn
    )
    assert restored is not None and restored.files == 4 and restored.skipped == 1
    assert (new / "weights.bin").read_bytes() == big
    assert (new / "src" / "train.py").read_text() == "print('hi')\n"
    assert os.stat(new / "src" / "train.py").st_mode & 0o100
    assert (new / "notes.txt").read_text() == "new"
    assert not (new / "old-stale").exists()  # emptied, and not in the copy
    assert (new / "empty" / "deeper").is_dir() and (new / "cache").is_dir()
    # the layer's packages move; its links and pyvenv.cfg are the new node's to make
    assert (new / ".gpulease" / "venv" / "lib" / "pkg.py").read_text() == "installed by pip"
    assert (new / ".gpulease" / "venv" / "bin").is_dir()
    assert not (new / ".gpulease" / "venv" / "pyvenv.cfg").exists()
    assert not os.path.lexists(new / ".gpulease" / "venv" / "bin" / "python")
    assert (new.parent / "run" / workspace_sync.WORKDIR_MARKER).exists()  # no workdir over it

    # restoring again fetches nothing: every file is there already
    inode = os.stat(new / "weights.bin").st_ino
    again = workspace_sync.restore(spec_at(fleet, instance_id, new, workspace_restore=True), conn)
    assert again is not None and again.sent_chunks == 0
    assert os.stat(new / "weights.bin").st_ino == inode


def test_links_fifos_and_hard_links_in_a_workspace_are_not_saved(
    http: TestClient, ann: Caller, tick: Tick, runner_for: RunnerFor, fleet: FakeBackend,
    tmp_path: Path,
) -> None:  # fmt: skip
    instance_id, runner = make_running_instance(ann, tick, runner_for, "box")
    secret = tmp_path / "server-secret"
    secret.write_text("not the job's")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "ok.txt").write_text("mine")
    (ws / "link").symlink_to(secret)
    (ws / "dirlink").symlink_to(tmp_path)
    os.mkfifo(ws / "pipe")
    os.link(secret, ws / "hard")
    conn = connection(http, runner)
    saved = workspace_sync.save(spec_at(fleet, instance_id, ws), conn)
    assert saved is not None and saved.files == 1 and saved.skipped == 1  # the hard link
    snapshot = runner.call("GET", "/workspace/snapshot").json()
    assert [f["path"] for f in snapshot["files"]] == ["ok.txt"]


def test_a_runner_reaches_only_its_own_instances_workspace(
    http: TestClient, ann: Caller, bob: Caller, tick: Tick, runner_for: RunnerFor,
    fleet: FakeBackend, tmp_path: Path,
) -> None:  # fmt: skip
    ann_id, ann_runner = make_running_instance(ann, tick, runner_for, "box")
    bob_id, bob_runner = make_running_instance(bob, tick, runner_for, "other")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "private.txt").write_text("ann's")
    workspace_sync.save(spec_at(fleet, ann_id, ws), connection(http, ann_runner))
    (sha,) = ann_runner.call("GET", "/workspace/snapshot").json()["files"][0]["chunks"]
    assert bob_runner.call("GET", "/workspace/snapshot").status_code == 204
    r = bob_runner.call("POST", "/workspace/chunks/fetch", json={"chunks": [sha]})
    assert r.status_code == 404 and "no chunk" in r.json()["detail"]
    # bob's runner may not build a snapshot out of ann's chunks either
    r = bob_runner.call(
        "PUT", "/workspace/snapshot",
        json={"files": [{"path": "x", "size": 5, "mode": 0o644, "mtime": 1.0, "chunks": [sha]}]},
    )  # fmt: skip
    assert r.status_code == 409 and "send them first" in r.json()["detail"]
    assert ann.get("/api/v1/instances/other").status_code == 404
    no_token = http.get("/runner/v1/workspace/snapshot")
    assert no_token.status_code == 401


def test_bad_workspace_calls_get_a_4xx_that_says_what_is_wrong(
    ann: Caller, tick: Tick, runner_for: RunnerFor, fleet: FakeBackend
) -> None:
    _, runner = make_running_instance(ann, tick, runner_for, "box")
    sha = "ab" * 32

    def put(**file: object) -> tuple[int, str]:
        entry = {"path": "a.txt", "size": 0, "mode": 0o644, "mtime": 1.0, "chunks": [], **file}
        r = runner.call("PUT", "/workspace/snapshot", json={"files": [entry]})
        return r.status_code, r.json()["detail"]

    assert put(path="../escape")[0] == 422
    assert put(path="/etc/passwd")[0] == 422
    assert put(size=-1)[0] == 422
    assert put(size=10, chunks=[])[1].endswith("not 0")
    assert put(mode=0o4755)[0] == 422
    assert put(chunks=["nothex"], size=3)[0] == 422
    code, detail = put(size=3, chunks=[sha])
    assert code == 409 and "send them first" in detail
    entry = {"path": "a.txt", "size": 0, "mode": 0o644, "mtime": 1.0, "chunks": []}
    for dirs in (["../up"], ["a.txt"], ["a.txt/under"], ["d", "d"]):
        r = runner.call("PUT", "/workspace/snapshot", json={"files": [entry], "dirs": dirs})
        assert r.status_code == 422, (dirs, r.text)
    assert "is not a tree of files and empty directories" in r.json()["detail"]
    r = runner.call("POST", "/workspace/unchanged", json={"snapshot": "x" * 300})
    assert r.status_code == 422
    r = runner.call("POST", "/workspace/chunks", content=b"\x00" * 10)
    assert r.status_code == 422 and "malformed chunk pack" in r.json()["detail"]
    r = runner.call("POST", "/workspace/chunks", content=pack([(sha, b"not its bytes")]))
    assert r.status_code == 422 and "hash to" in r.json()["detail"]
    r = runner.call("POST", "/workspace/missing", json={"chunks": [[sha, CHUNK_SIZE + 1]]})
    assert r.status_code == 422
    r = runner.call("POST", "/workspace/chunks/fetch", json={"chunks": ["x"]})
    assert r.status_code == 422


def stop(owner: Caller, name: str, tick: Tick, runner: RunnerDouble) -> None:
    assert owner.post(f"/api/v1/instances/{name}/stop").status_code == 200
    tick()
    runner.stopped()
    tick()
    assert owner.get(f"/api/v1/instances/{name}").json()["status"] == "stopped"


def test_a_start_goes_back_to_its_node_or_moves_when_that_node_is_full_and_is_told(
    http: TestClient, ann: Caller, bob: Caller, tick: Tick, runner_for: RunnerFor,
    fleet: FakeBackend, rt: Runtime, tmp_path: Path,
) -> None:  # fmt: skip
    far_gpu = DiscoveredGpu(0, "far-0", "T4", "T4", 16 * 1024, simulated=True)
    with transaction(rt.sessions) as session:
        (home,) = session.scalars(select(Node)).all()
        home_name = home.name
        nodes.register_node(session, "gpu-far", "fake", Inventory(None, None, [far_gpu]))
    instance_id, runner = make_running_instance(ann, tick, runner_for, "box", gpu="T4:1")
    assert ann.get("/api/v1/instances/box").json()["node"] == home_name
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("kept")
    workspace_sync.save(spec_at(fleet, instance_id, ws), connection(http, runner))
    stop(ann, "box", tick, runner)
    assert ann.get("/api/v1/instances/box").json()["last_node"] == home_name
    _, filler = make_running_instance(bob, tick, runner_for, "filler", gpu="T4:1")
    assert bob.get("/api/v1/instances/filler").json()["node"] == home_name  # it is full now

    assert ann.post("/api/v1/instances/box/start").status_code == 200
    tick()
    spec = fleet.started[-1]
    assert spec.instance_id == instance_id and spec.node == "gpu-far"
    assert spec.workspace_restore and spec.workspace_save
    shown = ann.get("/api/v1/instances/box").json()
    assert shown["last_node"] == "gpu-far"
    message = f"moved from {home_name} to gpu-far: node {home_name} is full"
    assert shown["status_message"].startswith(message), shown["status_message"]
    said = [n["message"] for n in ann.get("/api/v1/notifications").json()]
    assert any(message in m for m in said), said
    assert not any(message in n["message"] for n in bob.get("/api/v1/notifications").json())

    # both nodes free again: it goes back to gpu-far, where it last ran (not the first node)
    moved = runner_for(instance_id)
    moved.ready()
    stop(ann, "box", tick, moved)
    stop(bob, "filler", tick, filler)
    assert ann.post("/api/v1/instances/box/start").status_code == 200
    tick()
    assert fleet.started[-1].node == "gpu-far" and not fleet.started[-1].workspace_restore
    stop(ann, "box", tick, runner_for(instance_id))

    # storage is metered from the saved copy, not from the server's disk
    billing.workspace_storage(rt)
    with transaction(rt.sessions) as session:
        meter = session.scalars(
            select(StorageMeter).where(StorageMeter.ref_id == instance_id)
        ).one()
        assert meter.kib == 1  # 4 bytes, rounded up to a KiB

    assert ann.post("/api/v1/instances/box/release").status_code == 200
    tick()
    with transaction(rt.sessions) as session:
        assert session.scalar(select(func.count()).select_from(WorkspaceChunk)) == 0
        scope = StorageKey.scope == f"workspace:{instance_id}"
        assert session.scalar(select(func.count()).select_from(StorageKey).where(scope)) == 0
    assert blob_keys(rt, "w/") == [] and blob_keys(rt, "wm/") == []
    assert fleet.deleted_workspaces == [("gpu-far", str(instance_id))]


def test_a_link_planted_where_a_saved_file_goes_is_replaced_and_one_on_its_way_refused(
    http: TestClient, ann: Caller, tick: Tick, runner_for: RunnerFor, fleet: FakeBackend,
    tmp_path: Path,
) -> None:  # fmt: skip
    instance_id, runner = make_running_instance(ann, tick, runner_for, "box")
    conn = connection(http, runner)
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "top.txt").write_text("top")
    (ws / "sub" / "deep.txt").write_text("deep")
    workspace_sync.save(spec_at(fleet, instance_id, ws), conn)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("not the job's")
    new = tmp_path / "node-b" / "ws"
    new.mkdir(parents=True)
    (new / "top.txt").symlink_to(outside / "victim")  # left by a job of an earlier start
    (new / "sub").symlink_to(outside)
    spec = spec_at(fleet, instance_id, new, workspace_restore=True)
    with pytest.raises(workspace_sync.WorkspaceSyncError, match="could not be restored"):
        workspace_sync.restore(spec, conn)
    assert (outside / "victim").read_text() == "not the job's"
    assert not (outside / "deep.txt").exists()
    (new / "sub").unlink()
    workspace_sync.restore(spec, conn)
    assert not (new / "top.txt").is_symlink() and (new / "top.txt").read_text() == "top"
    assert (new / "sub" / "deep.txt").read_text() == "deep"
    assert (outside / "victim").read_text() == "not the job's"


Box = tuple[int, RunnerDouble, Path]  # a running instance, its runner, its node workspace


@pytest.fixture
def box(ann: Caller, tick: Tick, runner_for: RunnerFor, fleet: FakeBackend, tmp_path: Path) -> Box:
    instance_id, runner = make_running_instance(ann, tick, runner_for, "box")
    ws = tmp_path / "ws"
    ws.mkdir()
    return instance_id, runner, ws


def counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files each save reads and hashes from now on, by path, in order."""
    read: list[str] = []
    real = workspace_sync._read_file

    def counted(entry: safefs.Entry, relative: str):  # type: ignore[no-untyped-def]
        read.append(relative)
        return real(entry, relative)

    monkeypatch.setattr(workspace_sync, "_read_file", counted)
    return read


def test_the_node_index_spares_unchanged_files_and_a_corrupt_one_means_reading_all(
    http: TestClient, fleet: FakeBackend, box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    instance_id, runner, ws = box
    for n in range(20):
        (ws / f"f{n}.txt").write_text(f"file {n}")
    spec = spec_at(fleet, instance_id, ws)
    conn = connection(http, runner)
    read = counting_reads(monkeypatch)
    workspace_sync.save(spec, conn, clock_ns=later)
    assert len(read) == 20
    index = workspace_sync.index_path(spec)
    assert index.exists() and os.stat(index).st_mode & 0o077 == 0  # the runner's alone
    assert not index.is_relative_to(ws)  # nowhere the job can write

    read.clear()
    with open(ws / "f3.txt", "a") as grown:  # same inode, new size, new ctime
        grown.write(" and more")
    os.utime(ws / "f4.txt", ns=(1, 1))  # back-dated: its ctime still changes
    saved = workspace_sync.save(spec, conn, clock_ns=later)
    assert sorted(read) == ["f3.txt", "f4.txt"]
    assert saved is not None and saved.files == 20 and saved.read_files == 2

    read.clear()
    index.write_bytes(b"not an index" * 100)  # a cache: corrupt means hash everything
    saved = workspace_sync.save(spec, conn, clock_ns=later)
    assert len(read) == 20 and saved is not None and saved.sent_chunks == 0
    snapshot = runner.call("GET", "/workspace/snapshot").json()
    files = {f["path"]: f for f in snapshot["files"]}
    assert files["f3.txt"]["size"] == len("file 3 and more")


def test_a_file_changed_just_before_a_save_is_read_again_by_the_next(
    http: TestClient, fleet: FakeBackend, box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    instance_id, runner, ws = box
    (ws / "fresh.txt").write_text("written a moment before the save")
    spec = spec_at(fleet, instance_id, ws)
    conn = connection(http, runner)
    read = counting_reads(monkeypatch)
    now = time.time_ns()  # the save runs as the file is written: within one timestamp tick
    workspace_sync.save(spec, conn, clock_ns=lambda: now)
    workspace_sync.save(spec, conn, clock_ns=later)
    assert read == ["fresh.txt", "fresh.txt"]


def test_a_link_swapped_in_after_indexing_or_before_the_send_is_never_followed(
    http: TestClient, fleet: FakeBackend, box: Box, rt: Runtime, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    instance_id, runner, ws = box
    secret = tmp_path / "server-secret"
    secret.write_bytes(b"S" * 5000)
    (ws / "indexed.bin").write_bytes(b"i" * 5000)
    spec = spec_at(fleet, instance_id, ws)
    conn = connection(http, runner)
    workspace_sync.save(spec, conn, clock_ns=later)
    # the indexed file becomes a link to a secret of the same size; a new file, listed and
    # hashed, becomes one too before its chunk is read again to be sent
    (ws / "indexed.bin").unlink()
    (ws / "indexed.bin").symlink_to(secret)
    (ws / "new.bin").write_bytes(b"n" * 5000)
    real = workspace_sync.list_workspace

    def swapped_after(*args: object, **kw: object) -> workspace_sync.Listing:
        listing = real(*args, **kw)  # type: ignore[arg-type]
        (ws / "new.bin").unlink()
        (ws / "new.bin").symlink_to(secret)
        return listing

    monkeypatch.setattr(workspace_sync, "list_workspace", swapped_after)
    saved = workspace_sync.save(spec, conn, clock_ns=later)
    assert saved is not None and saved.files == 0 and saved.skipped == 1
    assert runner.call("GET", "/workspace/snapshot").json()["files"] == []
    with transaction(rt.sessions) as session:  # no chunk of the secret reached the server
        sizes = list(session.scalars(select(WorkspaceChunk.sha256)))
    assert hashlib.sha256(secret.read_bytes()).hexdigest() not in sizes


def test_a_file_grown_huge_between_its_stat_and_its_read_is_saved_at_its_stat_size(
    http: TestClient, fleet: FakeBackend, box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    instance_id, runner, ws = box
    (ws / "grows.bin").write_bytes(b"g" * 1000)
    spec = spec_at(fleet, instance_id, ws)
    real = workspace_sync._read_chunks

    def grown_first(fd: int, size: int):  # type: ignore[no-untyped-def]
        os.truncate(ws / "grows.bin", 64 * 2**30)  # 64 GiB, sparse: the job's doing
        return real(fd, size)

    monkeypatch.setattr(workspace_sync, "_read_chunks", grown_first)
    saved = workspace_sync.save(spec, connection(http, runner), clock_ns=later)
    assert saved is not None and (saved.bytes, saved.sent_bytes) == (1000, 1000)
    (listed,) = runner.call("GET", "/workspace/snapshot").json()["files"]
    assert listed["size"] == 1000
    # the index does not vouch for what it saw change while it read: the next save reads it
    index = workspace_sync.open_index(workspace_sync.index_path(spec))
    try:
        assert index.lookup("grows.bin", FileStat.of(os.stat(ws / "grows.bin"))) is None
    finally:
        index.close()


def test_billing_ends_when_the_jobs_end_and_a_long_save_outlives_the_stop_grace(
    http: TestClient, ann: Caller, tick: Tick, runner_for: RunnerFor, fleet: FakeBackend,
    rt: Runtime,
) -> None:  # fmt: skip
    instance_id, runner = make_running_instance(ann, tick, runner_for, "box")
    with transaction(rt.sessions) as session:
        started = session.scalars(
            select(UsageSegment.started_at).where(UsageSegment.instance_id == instance_id)
        ).one()
    assert ann.post("/api/v1/instances/box/stop").status_code == 200
    jobs_ended = started + timedelta(seconds=90)
    http.app.dependency_overrides[request_time] = lambda: jobs_ended  # type: ignore[attr-defined]
    try:
        assert runner.call("POST", "/workspace/saving", json={}).status_code == 204
        again = jobs_ended + timedelta(seconds=30)  # a second call changes nothing
        http.app.dependency_overrides[request_time] = lambda: again  # type: ignore[attr-defined]
        assert runner.call("POST", "/workspace/saving", json={}).status_code == 204
    finally:
        http.app.dependency_overrides.pop(request_time)  # type: ignore[attr-defined]
    with transaction(rt.sessions) as session:
        segment = session.scalars(
            select(UsageSegment).where(UsageSegment.instance_id == instance_id)
        ).one()
        assert segment.ended_at == jobs_ended and segment.billed_seconds == 90

    # past the stop grace the save goes on; past its own limit the runner is killed
    handle = fleet.handle_for(instance_id)
    assert handle is not None
    grace = timedelta(seconds=rt.settings.stop_grace_s)
    launcher.finish_stops(rt, now=jobs_ended + grace * 10)
    assert ann.get("/api/v1/instances/box").json()["status"] == "stopping"
    assert fleet.runners[handle].stop_calls == []
    limit = timedelta(seconds=rt.settings.workspace_save_max_s)
    launcher.finish_stops(rt, now=jobs_ended + limit + timedelta(seconds=1))
    shown = ann.get("/api/v1/instances/box").json()
    assert shown["status"] == "stopped" and fleet.runners[handle].stop_calls == [True]
    with transaction(rt.sessions) as session:
        segment = session.scalars(
            select(UsageSegment).where(UsageSegment.instance_id == instance_id)
        ).one()
        assert segment.ended_at == jobs_ended and segment.billed_seconds == 90


def test_a_running_instance_is_saved_every_interval_in_the_background(
    http: TestClient, ann: Caller, tick: Tick, runner_for: RunnerFor, fleet: FakeBackend,
    tmp_path: Path,
) -> None:  # fmt: skip
    instance_id, runner = make_running_instance(ann, tick, runner_for, "box")
    assert fleet.started[-1].workspace_save_interval_s == 600  # the default
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "checkpoint.pt").write_bytes(b"epoch 1")
    agent = Agent(spec_at(fleet, instance_id, ws, workspace_save_interval_s=0.05))
    agent.connection = connection(http, runner)
    saver = threading.Thread(target=agent._save_often)
    saver.start()
    try:
        first = wait_until(lambda: ann.get("/api/v1/instances/box").json()["workspace_saved_at"])
        (ws / "checkpoint.pt").write_bytes(b"epoch 2")
        wait_until(
            lambda: (
                ann.get("/api/v1/instances/box").json()["workspace_saved_at"] != first
                and runner.call("GET", "/workspace/snapshot").json()["files"][0]["size"] == 7
                and fetched(http, runner) == b"epoch 2"
            )
        )
    finally:
        agent.request_stop("the test is over")
        saver.join(10)
        agent.connection.close()
    assert not saver.is_alive()
    assert ann.get("/api/v1/instances/box").json()["status"] == "running"


def fetched(http: TestClient, runner: RunnerDouble) -> bytes:
    (listed,) = runner.call("GET", "/workspace/snapshot").json()["files"]
    r = runner.call("POST", "/workspace/chunks/fetch", json={"chunks": listed["chunks"]})
    return b"".join(data for _, data in unpack(r.content))


def wait_until(probe: Callable[[], object], timeout: float = 20.0) -> object:
    deadline = time.monotonic() + timeout
    while not (got := probe()):
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)
    return got


def test_a_save_that_finds_the_files_of_the_last_snapshot_only_says_so(
    http: TestClient, ann: Caller, fleet: FakeBackend, box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    instance_id, runner, ws = box
    (ws / "a.txt").write_text("same")
    spec = spec_at(fleet, instance_id, ws)
    conn = connection(http, runner)
    workspace_sync.save(spec, conn, clock_ns=later)
    saved_at = ann.get("/api/v1/instances/box").json()["workspace_saved_at"]
    calls: list[str] = []
    real = conn.call

    def recorded(method: str, path: str, **kw: object):  # type: ignore[no-untyped-def]
        calls.append(path.rsplit("/", 1)[-1])
        return real(method, path, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(conn, "call", recorded)
    workspace_sync.save(spec, conn, clock_ns=later)
    assert calls == ["unchanged"]
    assert ann.get("/api/v1/instances/box").json()["workspace_saved_at"] > saved_at
    # another snapshot since (as from another node): the server refuses, the whole one goes
    other = replace(spec, run_dir=ws.parent / "other-node")
    workspace_sync.save(other, conn, use_index=False)
    calls.clear()
    workspace_sync.save(spec, conn, clock_ns=later)
    assert calls == ["unchanged", "missing", "snapshot"]
    r = runner.call("POST", "/workspace/unchanged", json={"snapshot": "wm/1/1/nothing"})
    assert r.status_code == 409 and "send the whole snapshot" in r.json()["detail"]
