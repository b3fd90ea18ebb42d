"""Workspace snapshots: an instance's files in the server's blob store, so it can start elsewhere.

On a fleet backend a workspace lives on the node that ran the instance. When its runner
stops it saves the workspace here, the way a dataset is pushed (docs/ray.md): it sends the
chunk ids of every file (runner/workspace_sync.py), the answer names the chunks the server
lacks, it sends only those in chunk packs, then the snapshot, the file list. When the
instance next starts on another node (its own is full or gone), that node's runner reads
the snapshot and fetches the chunks its copy of the workspace lacks.

At rest it is encrypted like a dataset (services/datasets/keys.py): each instance has a
workspace key (storage_keys scope 'workspace:ID', under the master key), every chunk is
sealed with it on its own, bound to the instance and its plaintext hash, inside pack blobs
`w/OWNER/INSTANCE/RANDOM`, and the file list is sealed with it at `wm/OWNER/INSTANCE/RANDOM`.
Deduplication stays within one instance: a chunk is stored once per instance, so a second
stop sends only what changed since the first. A new snapshot drops the chunks it no longer
names; a release deletes the key, the rows and the blobs.

Functions that touch the blob store run their own short transactions, with the blob I/O
between them, never inside one.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError as DbIntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpulease.core.datasets import check_path, tree_conflict
from gpulease.core.durations import span
from gpulease.core.errors import Conflict, InvalidInput, NotFound
from gpulease.server.db import batches, transaction, utcnow
from gpulease.server.orm import Instance, StorageKey, WorkspaceChunk
from gpulease.server.services import metering
from gpulease.server.services.datasets.keys import ensure_key
from gpulease.server.services.datasets.vault import Vault
from gpulease.server.services.instances.states import STOPPING
from gpulease.storage.chunking import CHUNK_SIZE, pack, unpack_checked
from gpulease.storage.crypto import IntegrityError, open_sealed, seal

FORMAT = 1
MAX_FILES = 200_000
MAX_ASK_CHUNKS = 20_000  # chunk ids per "which do you lack" question
MAX_PACK_CHUNKS = 10_000
MAX_PACK_BYTES = 80 * 1024 * 1024  # a pack sent by a runner
MAX_FETCH_BYTES = 64 * 1024 * 1024  # the chunks one fetch may ask for
MAX_LIST_BYTES = 64 * 1024 * 1024  # a snapshot's file list as JSON
_SHA = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class SnapshotFile:
    path: str  # relative to the workspace, '/'-separated
    size: int
    mode: int  # permission bits (0o644, 0o755, ...)
    mtime: float
    chunks: tuple[str, ...]  # sha256 hex, in order: chunk i is bytes [i*CHUNK_SIZE, ...)


@dataclass(frozen=True)
class Snapshot:
    files: tuple[SnapshotFile, ...]
    dirs: tuple[str, ...] = ()  # empty directories: holding no file or directory listed

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def chunk_sizes(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for f in self.files:
            for index, sha in enumerate(f.chunks):
                size = min(CHUNK_SIZE, f.size - index * CHUNK_SIZE)
                if sizes.setdefault(sha, size) != size:
                    raise InvalidInput(f"chunk {sha} is listed with two different sizes")
        return sizes

    def encode(self) -> bytes:
        rows = [(f.path, f.size, f.mode, f.mtime, f.chunks) for f in self.files]
        text = json.dumps(
            {"format": FORMAT, "chunk_size": CHUNK_SIZE, "files": rows, "dirs": self.dirs}
        )
        return zlib.compress(text.encode(), 1)

    @classmethod
    def decode(cls, data: bytes) -> Snapshot:
        raw = json.loads(zlib.decompress(data))
        if raw.get("format") != FORMAT or raw.get("chunk_size") != CHUNK_SIZE:
            raise IntegrityError("a workspace snapshot has a format this server does not read")
        return cls(
            tuple(
                SnapshotFile(p, int(s), int(m), float(t), tuple(c))
                for p, s, m, t, c in raw["files"]
            ),
            tuple(str(d) for d in raw.get("dirs", ())),  # none in a snapshot from before
        )


def check_snapshot(files: Sequence[SnapshotFile], dirs: Sequence[str] = ()) -> Snapshot:
    """The snapshot of files and empty dirs, or InvalidInput saying which entry is wrong."""
    if len(files) + len(dirs) > MAX_FILES:
        raise InvalidInput(
            f"a workspace snapshot holds at most {MAX_FILES} files and empty directories"
        )
    for directory in dirs:
        check_path(directory)
    for f in files:
        check_path(f.path)
        if f.size < 0:
            raise InvalidInput(f"{f.path!r}: a size cannot be negative")
        if len(f.chunks) != -(-f.size // CHUNK_SIZE):
            raise InvalidInput(
                f"{f.path!r}: a file of {f.size} bytes has {-(-f.size // CHUNK_SIZE)} chunks "
                f"of {CHUNK_SIZE} bytes, not {len(f.chunks)}"
            )
        if not 0 <= f.mode <= 0o777:
            raise InvalidInput(f"{f.path!r}: mode {f.mode:o} is not a permission between 0 and 777")
        if not math.isfinite(f.mtime):
            raise InvalidInput(f"{f.path!r}: its mtime is not a number")
        check_chunk_ids(f.chunks)
    conflict = tree_conflict([*(f.path for f in files), *dirs])
    if conflict:
        raise InvalidInput(
            f"the workspace snapshot is not a tree of files and empty directories: {conflict}"
        )
    snapshot = Snapshot(tuple(sorted(files, key=lambda f: f.path)), tuple(sorted(dirs)))
    snapshot.chunk_sizes()  # the same chunk twice with two sizes is refused here
    return snapshot


def check_chunk_ids(chunks: Iterable[str]) -> None:
    for sha in chunks:
        if not _SHA.fullmatch(sha):
            raise InvalidInput(f"{sha!r} is not a lowercase hex SHA-256")


def workspace_scope(instance_id: int) -> str:
    return f"workspace:{instance_id}"


def chunk_aad(instance_id: int, sha256: str) -> bytes:
    """What a workspace chunk's seal is bound to: its instance and its plaintext hash."""
    return f"gpulease/workspace/{instance_id}/{sha256}".encode()


def manifest_aad(blob_key: str) -> bytes:
    return b"gpulease/workspace-manifest/" + blob_key.encode()


def _key(session: Session, vault: Vault, instance: Instance) -> bytes:
    row = ensure_key(session, vault.ring, workspace_scope(instance.id), instance.owner_id)
    return vault.ring.unwrap(row)


def _instance(session: Session, instance_id: int) -> Instance:
    instance = session.get(Instance, instance_id)
    if instance is None:
        raise NotFound(f"no instance {instance_id}")
    return instance


def _rows(session: Session, instance_id: int, shas: Sequence[str]) -> dict[str, WorkspaceChunk]:
    found: dict[str, WorkspaceChunk] = {}
    ordered = sorted(set(shas))
    for batch in batches(ordered):
        for row in session.scalars(
            select(WorkspaceChunk).where(
                WorkspaceChunk.instance_id == instance_id,
                WorkspaceChunk.sha256.in_(batch),
            )
        ):
            found[row.sha256] = row
    return found


# -- saving, by the runner of the node it stops on ---------------------------------------------


def missing_chunks(
    session: Session, instance_id: int, chunks: Sequence[tuple[str, int]]
) -> list[str]:
    """Of chunks (sha256, size), those the instance's store lacks, in the order asked."""
    if len(chunks) > MAX_ASK_CHUNKS:
        raise InvalidInput(f"ask about at most {MAX_ASK_CHUNKS} chunks at a time")
    check_chunk_ids(sha for sha, _ in chunks)
    for sha, size in chunks:
        if not 0 <= size <= CHUNK_SIZE:
            raise InvalidInput(f"chunk {sha}: {size} bytes is not a chunk's size")
    known = _rows(session, instance_id, [sha for sha, _ in chunks])
    for sha, size in chunks:
        row = known.get(sha)
        if row is not None and row.size != size:
            raise InvalidInput(f"chunk {sha} is listed as {size} bytes, not {row.size}")
    return [sha for sha, _ in chunks if sha not in known]


def store_chunks(
    sessions: sessionmaker[Session],
    vault: Vault,
    instance_id: int,
    body: bytes | bytearray | memoryview,
) -> int:
    """Take a pack of plaintext chunks (gpulease.storage.chunking), check each one's SHA-256,
    seal the ones the store lacks with the workspace key and keep them as one pack blob.
    Returns how many were new."""
    records: dict[str, bytes] = {}
    why = "corrupted on the way, or its file changed while it was read"
    for sha, data in unpack_checked(body, max_records=MAX_PACK_CHUNKS, why=why):
        if len(data) > CHUNK_SIZE:
            raise InvalidInput(f"chunk {sha} has {len(data)} bytes, more than a chunk")
        records[sha] = data
    with transaction(sessions) as session:
        instance = _instance(session, instance_id)
        key = _key(session, vault, instance)
        owner_id = instance.owner_id
        known = _rows(session, instance_id, list(records))
    todo = [(sha, data) for sha, data in records.items() if sha not in known]
    if not todo:
        return 0
    pack_key = f"w/{owner_id}/{instance_id}/{secrets.token_hex(16)}"
    pieces, placements, offset = [], [], 0
    for sha, data in todo:
        sealed = seal(key, data, chunk_aad(instance_id, sha))
        pieces.append(sealed)
        placements.append((sha, len(data), offset, len(sealed)))
        offset += len(sealed)
    vault.store.put_pieces(pack_key, pieces)
    vault.store.sync()
    now = utcnow()
    stored = 0
    with transaction(sessions) as session:
        for sha, size, at, length in placements:
            try:
                with session.begin_nested():
                    session.add(
                        WorkspaceChunk(
                            instance_id=instance_id,
                            sha256=sha,
                            size=size,
                            blob=pack_key,
                            offset=at,
                            length=length,
                            created_at=now,
                        )
                    )
                stored += 1
            except DbIntegrityError:  # the same chunk sent twice at once: the first one wins
                continue
    if not stored:
        vault.store.delete(pack_key)
    return stored


@dataclass(frozen=True)
class Saved:
    files: int
    bytes: int
    dropped_chunks: int
    snapshot: str  # its blob key: what a runner names when its next save finds no change


def save_snapshot(
    sessions: sessionmaker[Session],
    vault: Vault,
    instance_id: int,
    files: Sequence[SnapshotFile],
    dirs: Sequence[str] = (),
) -> Saved:
    """Make files and the empty directories dirs the instance's snapshot. Every chunk they
    name must have been stored (Conflict otherwise: send it first). The previous snapshot
    and the chunks only it named are deleted."""
    snapshot = check_snapshot(files, dirs)
    sizes = snapshot.chunk_sizes()
    with transaction(sessions) as session:
        instance = _instance(session, instance_id)
        key = _key(session, vault, instance)
        owner_id = instance.owner_id
        rows = _rows(session, instance_id, list(sizes))
    lacking = [sha for sha in sizes if sha not in rows]
    if lacking:
        raise Conflict(
            f"the snapshot names {len(lacking)} chunks the server does not have (such as "
            f"{lacking[0]}); send them first"
        )
    for sha, size in sizes.items():
        if rows[sha].size != size:
            raise InvalidInput(f"chunk {sha} is listed as {size} bytes, not {rows[sha].size}")
    blob_key = f"wm/{owner_id}/{instance_id}/{secrets.token_hex(16)}"
    vault.store.put(blob_key, seal(key, snapshot.encode(), manifest_aad(blob_key)))
    vault.store.sync()
    with transaction(sessions) as session:
        instance = _instance(session, instance_id)
        previous = instance.workspace_snapshot
        instance.workspace_snapshot = blob_key
        instance.workspace_snapshot_at = utcnow()
        instance.workspace_snapshot_bytes = snapshot.size
        dead = [
            (row.id, row.blob)
            for row in session.scalars(
                select(WorkspaceChunk).where(WorkspaceChunk.instance_id == instance_id)
            )
            if row.sha256 not in sizes
        ]
        packs = _drop_rows(session, dead)
    _delete_blobs(vault, [*packs, *([previous] if previous else [])])
    return Saved(len(snapshot.files), snapshot.size, len(dead), blob_key)


def confirm_snapshot(session: Session, instance: Instance, snapshot: str, now: datetime) -> None:
    """The runner's save found the very files of its last snapshot: that copy counts as
    saved now. Conflict when the instance's snapshot is another one now (a save from
    another node, or none): the runner then sends the whole snapshot."""
    if instance.workspace_snapshot is None or instance.workspace_snapshot != snapshot:
        raise Conflict("the instance's saved workspace changed since; send the whole snapshot")
    instance.workspace_snapshot_at = now


def _drop_rows(session: Session, dead: Sequence[tuple[int, str]]) -> list[str]:
    """Delete the chunk rows dead (id, pack) and return the packs no row points into now."""
    ids = [chunk_id for chunk_id, _ in dead]
    for batch in batches(ids):
        session.execute(
            delete(WorkspaceChunk)
            .where(WorkspaceChunk.id.in_(batch))
            .execution_options(synchronize_session=False)
        )
    packs = sorted({blob for _, blob in dead})
    used: set[str] = set()
    for some in batches(packs):
        used.update(
            session.scalars(
                select(WorkspaceChunk.blob).where(WorkspaceChunk.blob.in_(some)).distinct()
            )
        )
    return [p for p in packs if p not in used]


def _delete_blobs(vault: Vault, keys: Iterable[str]) -> None:
    for blob_key in keys:
        vault.store.delete(blob_key)


def saving_started(session: Session, instance: Instance, now: datetime) -> None:
    """A stopping instance's runner says its jobs have ended and it is saving the workspace:
    billing ends now, not when the save does, and from now on the stop is bounded by the
    save's own limit instead of the stop grace (reconcilers/launcher.finish_stops). Only
    the first call counts; a running instance (a periodic save) is not touched."""
    if instance.status != STOPPING or instance.workspace_saving_since is not None:
        return
    metering.close_segment(session, instance, now)
    instance.workspace_saving_since = now


def copy_age(saved_at: datetime, now: datetime) -> str:
    """What a user is told of the copy a moved instance starts from: when it was saved and
    how long before now (work done after it is not in it)."""
    age = span(int((now - saved_at).total_seconds()))
    return (
        f"its workspace comes from the copy saved at {saved_at:%Y-%m-%d %H:%M} UTC, {age} "
        "before this start; what changed after it is not in it"
    )


# -- restoring, by the runner of the node it moved to -------------------------------------------


def read_snapshot(
    sessions: sessionmaker[Session], vault: Vault, instance_id: int
) -> Snapshot | None:
    """The instance's last snapshot, or None when its runner never saved one."""
    with transaction(sessions) as session:
        instance = _instance(session, instance_id)
        blob_key = instance.workspace_snapshot
        if blob_key is None:
            return None
        key = _key(session, vault, instance)
    sealed = vault.store.get(blob_key)
    return Snapshot.decode(
        open_sealed(key, sealed, manifest_aad(blob_key), f"workspace snapshot {blob_key}")
    )


def fetch_chunks(
    sessions: sessionmaker[Session], vault: Vault, instance_id: int, shas: Sequence[str]
) -> bytes:
    """A chunk pack of the plaintext chunks asked for, in the order asked; NotFound for a
    chunk the instance's store does not hold (another instance's is not found either)."""
    check_chunk_ids(shas)
    if len(shas) > MAX_PACK_CHUNKS:
        raise InvalidInput(f"ask for at most {MAX_PACK_CHUNKS} chunks at a time")
    with transaction(sessions) as session:
        instance = _instance(session, instance_id)
        key = _key(session, vault, instance)
        rows = {
            sha: (row.blob, row.offset, row.length, row.size)
            for sha, row in _rows(session, instance_id, shas).items()
        }
    absent = [sha for sha in shas if sha not in rows]
    if absent:
        raise NotFound(f"the workspace holds no chunk {absent[0]}")
    if sum(rows[sha][3] for sha in set(shas)) > MAX_FETCH_BYTES:
        raise InvalidInput(f"ask for at most {MAX_FETCH_BYTES} bytes of chunks at a time")
    by_blob: dict[str, list[str]] = defaultdict(list)
    for sha in dict.fromkeys(shas):
        by_blob[rows[sha][0]].append(sha)
    plain: dict[str, bytes] = {}
    for blob, wanted in by_blob.items():
        sealed = vault.store.read_ranges(blob, [(rows[s][1], rows[s][2]) for s in wanted])
        for sha, data in zip(wanted, sealed, strict=True):
            plain[sha] = open_sealed(
                key, data, chunk_aad(instance_id, sha), f"workspace chunk {sha}"
            )
    return pack((sha, plain[sha]) for sha in shas)


# -- release -----------------------------------------------------------------------------------


def forget(sessions: sessionmaker[Session], vault: Vault, instance_id: int) -> None:
    """Delete the instance's snapshot, its chunks and its workspace key (so what is left in
    old backups of the blob store cannot be opened)."""
    with transaction(sessions) as session:
        instance = _instance(session, instance_id)
        manifest = instance.workspace_snapshot
        instance.workspace_snapshot = None
        instance.workspace_snapshot_at = None
        instance.workspace_snapshot_bytes = 0
        dead = [
            (row.id, row.blob)
            for row in session.scalars(
                select(WorkspaceChunk).where(WorkspaceChunk.instance_id == instance_id)
            )
        ]
        packs = _drop_rows(session, dead)
        session.execute(
            delete(StorageKey)
            .where(StorageKey.scope == workspace_scope(instance_id))
            .execution_options(synchronize_session=False)
        )
    _delete_blobs(vault, [*packs, *([manifest] if manifest else [])])
