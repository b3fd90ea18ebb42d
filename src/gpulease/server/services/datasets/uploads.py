"""Pushing a dataset: start a push, send file lists (the answer names the chunks the server
lacks), send those chunks in packs, commit. Built for 100,000 small files per push.

A push is resumable for free: chunks that arrived stay (a later push of the same content
finds them and does not send them again), and a version appears only at commit, whole.
Functions that touch the blob store run their own transactions, with the blob I/O between
them, never inside one.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Table, func, select, update
from sqlalchemy.exc import IntegrityError as DbIntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpulease.core.datasets import check_dataset_name, check_path
from gpulease.core.errors import Conflict, InvalidInput, NotFound
from gpulease.server.db import readers, transaction, utcnow
from gpulease.server.orm import (
    Dataset,
    DatasetChunk,
    DatasetUpload,
    StorageKey,
    User,
)
from gpulease.server.services.datasets import quota
from gpulease.server.services.datasets.bulk import chunk_rows, execute_rows
from gpulease.server.services.datasets.garbage import collect_garbage
from gpulease.server.services.datasets.keys import (
    KeyRing,
    chunk_key_scope,
    dataset_scope,
    ensure_key,
    key_row,
    lock_owner,
    user_scope,
)
from gpulease.server.services.datasets.vault import Manifest, ManifestFile, Vault, chunk_aad
from gpulease.storage.chunking import CHUNK_SIZE, check_records, unpack_views
from gpulease.storage.crypto import KeyWrapper, seal_many

OPEN = "open"
COMMITTED = "committed"
ABANDONED = "abandoned"
REFUSED = "refused"

# An open push untouched this long is abandoned (its staged file lists are deleted; the
# chunks it sent stay until the owner's next garbage collection).
UPLOAD_TTL = timedelta(hours=24)
MAX_PART_FILES = 10_000
MAX_PARTS = 100_000
MAX_PACK_CHUNKS = 10_000
MAX_PACK_BYTES = 80 * 1024 * 1024
_SHA = re.compile(r"^[0-9a-f]{64}$")
_CHUNKS: Table = DatasetChunk.__table__  # type: ignore[assignment]

FileEntry = ManifestFile  # a file of a file list part: (path, size, chunk hashes)


@dataclass(frozen=True)
class Missing:
    chunks: list[str]
    bytes: int


@dataclass(frozen=True)
class Received:
    chunks: int
    bytes: int
    new_chunks: int


def staging_key(owner_id: int, upload_id: int, part: int) -> str:
    return f"s/{owner_id}/{upload_id}/{part:06d}"


def manifest_key(owner_id: int, dataset_id: int, upload_id: int, digest: str) -> str:
    """Where a version's manifest is stored; its last part is the manifest's digest
    (core/datasets.py manifest_digest), so that the version's row names it."""
    return f"m/{owner_id}/{dataset_id}/{upload_id}/{digest}"


def digest_in_manifest_key(key: str) -> str | None:
    """The manifest digest that manifest_key put in key; None for a key from before."""
    parts = key.split("/")
    return parts[4] if len(parts) == 5 and _SHA.fullmatch(parts[4]) else None


def chunk_sizes(entry: FileEntry) -> Iterator[tuple[str, int]]:
    for index, sha in enumerate(entry.chunks):
        yield sha, min(CHUNK_SIZE, entry.size - index * CHUNK_SIZE)


def check_entry(entry: FileEntry) -> None:
    check_path(entry.path)
    if entry.size < 0:
        raise InvalidInput(f"{entry.path!r}: a size cannot be negative")
    expected = -(-entry.size // CHUNK_SIZE)
    if len(entry.chunks) != expected:
        raise InvalidInput(
            f"{entry.path!r}: a file of {entry.size} bytes has {expected} chunks of "
            f"{CHUNK_SIZE} bytes, not {len(entry.chunks)}"
        )
    for sha in entry.chunks:
        if not _SHA.fullmatch(sha):
            raise InvalidInput(f"{entry.path!r}: {sha!r} is not a lowercase hex SHA-256")


# -- finding things ----------------------------------------------------------------------------


def get_upload(session: Session, owner: User, upload_id: int) -> DatasetUpload:
    """One of owner's pushes; someone else's is simply not found."""
    upload = session.get(DatasetUpload, upload_id)
    if upload is None or upload.owner_id != owner.id:
        raise NotFound(f"you have no dataset push {upload_id}")
    return upload


def open_upload(session: Session, owner_id: int, upload_id: int) -> DatasetUpload:
    upload = session.get(DatasetUpload, upload_id)
    if upload is None or upload.owner_id != owner_id:
        raise NotFound(f"you have no dataset push {upload_id}")
    if upload.state != OPEN:
        why = f": {upload.state_reason}" if upload.state_reason else ""
        raise Conflict(f"dataset push {upload_id} is {upload.state}{why}; push again")
    return upload


def dataset_key_of(session: Session, ring: KeyRing, dataset: Dataset) -> bytes:
    if dataset.key_id is None:
        raise Conflict(f"dataset {dataset.name} was removed")
    row = session.get(StorageKey, dataset.key_id)
    assert row is not None
    return ring.unwrap(row)


def live_dataset(session: Session, owner_id: int, name: str) -> Dataset | None:
    """owner's dataset called name that is not removed (with or without a version yet)."""
    return session.scalar(
        select(Dataset).where(
            Dataset.owner_id == owner_id, Dataset.name == name, Dataset.deleted_at.is_(None)
        )
    )


def _dataset_for_push(session: Session, ring: KeyRing, owner_id: int, name: str) -> Dataset:
    dataset = live_dataset(session, owner_id, name)
    if dataset is not None:
        return dataset
    now = utcnow()
    try:
        with session.begin_nested():
            dataset = Dataset(
                owner_id=owner_id,
                name=name,
                file_count=0,
                size_bytes=0,
                created_at=now,
                updated_at=now,
            )
            session.add(dataset)
            session.flush()
            dataset.key_id = ensure_key(session, ring, dataset_scope(dataset.id), owner_id).id
    except DbIntegrityError:
        dataset = live_dataset(session, owner_id, name)
        assert dataset is not None
    return dataset


def delete_staging(vault: Vault, staged: Iterable[tuple[int, int, int]]) -> None:
    for owner_id, upload_id, parts in staged:
        for part in range(parts):
            vault.store.delete(staging_key(owner_id, upload_id, part))


def close_upload(upload: DatasetUpload, state: str, reason: str) -> tuple[int, int, int]:
    upload.state = state
    upload.state_reason = reason[:500]
    upload.updated_at = utcnow()
    return upload.owner_id, upload.id, upload.parts


# -- the steps of a push ---------------------------------------------------------------------


def start_upload(
    sessions: sessionmaker[Session],
    vault: Vault,
    owner: User,
    name: str,
    *,
    files: int,
    size: int,
    quota_bytes: int,
) -> DatasetUpload:
    """Open a push of `files` files, `size` bytes in all, to dataset `name` (made, invisible
    until its first commit, if it does not exist). An open push of the same dataset is
    abandoned: the newest push wins; a push untouched for a day is abandoned too."""
    check_dataset_name(name)
    if files < 0 or size < 0:
        raise InvalidInput("files and bytes cannot be negative")
    stale: list[tuple[int, int, int]] = []
    with transaction(sessions) as session:
        lock_owner(session, vault.ring, owner.id)
        quota.check_push_size(quota.usage(session, owner.id), quota_bytes, size)
        now = utcnow()
        dataset = _dataset_for_push(session, vault.ring, owner.id, name)
        upload = DatasetUpload(
            owner_id=owner.id,
            dataset_id=dataset.id,
            state=OPEN,
            declared_files=files,
            declared_bytes=size,
            parts=0,
            files_listed=0,
            chunks_received=0,
            bytes_received=0,
            state_reason="",
            created_at=now,
            updated_at=now,
        )
        session.add(upload)
        session.flush()
        for other in session.scalars(
            select(DatasetUpload).where(
                DatasetUpload.owner_id == owner.id,
                DatasetUpload.state == OPEN,
                DatasetUpload.id != upload.id,
            )
        ):
            if other.dataset_id == dataset.id:
                stale.append(close_upload(other, ABANDONED, f"superseded by push {upload.id}"))
            elif other.updated_at < now - UPLOAD_TTL:
                stale.append(close_upload(other, ABANDONED, "untouched for a day"))
    delete_staging(vault, stale)
    return upload


def add_files(
    sessions: sessionmaker[Session],
    vault: Vault,
    owner_id: int,
    upload_id: int,
    part: int,
    files: Sequence[FileEntry],
    *,
    quota_bytes: int,
) -> Missing:
    """Stage part number `part` of the push's file list (sending a part again replaces it)
    and answer which of its chunks the server lacks. Chunks new to the owner are reserved
    against their quota now, so a push that cannot fit is refused before its bytes are sent."""
    if not 0 <= part < MAX_PARTS:
        raise InvalidInput(f"part must be between 0 and {MAX_PARTS - 1}")
    if len(files) > MAX_PART_FILES:
        raise InvalidInput(f"send at most {MAX_PART_FILES} files per part")
    sizes: dict[str, int] = {}
    for entry in files:
        check_entry(entry)
        for sha, size in chunk_sizes(entry):
            if sizes.setdefault(sha, size) != size:
                raise InvalidInput(f"chunk {sha} is listed with two different sizes")
    with transaction(readers(sessions)) as session:  # reads only: no write lock
        upload = open_upload(session, owner_id, upload_id)
        dataset = session.get(Dataset, upload.dataset_id)
        assert dataset is not None
        dataset_key = dataset_key_of(session, vault.ring, dataset)
    staged = Manifest(tuple(files))
    vault.seal_blob(dataset_key, staging_key(owner_id, upload_id, part), staged.encode())
    vault.store.sync()
    try:
        with transaction(sessions) as session:
            upload = open_upload(session, owner_id, upload_id)
            missing = _reserve(session, vault.ring, owner_id, sizes, quota_bytes)
            upload.parts = max(upload.parts, part + 1)
            upload.updated_at = utcnow()
    except quota.QuotaExceeded as exc:
        refuse_upload(sessions, vault, owner_id, upload_id, exc.message)
        raise
    return missing


def _reserve(
    session: Session, ring: KeyRing, owner_id: int, sizes: dict[str, int], quota_bytes: int
) -> Missing:
    ukey = lock_owner(session, ring, owner_id)
    known: dict[str, bool] = {}
    for sha, stored, size in chunk_rows(session, owner_id, "sha256, stored, size", sorted(sizes)):
        if size != sizes[sha]:
            raise InvalidInput(f"chunk {sha} is listed as {sizes[sha]} bytes, not {size}")
        known[sha] = bool(stored)
    new = [sha for sha in sizes if sha not in known]
    if new:
        now = utcnow()
        wrapped = KeyWrapper(ukey).wrap_new_keys([chunk_key_scope(owner_id, sha) for sha in new])
        execute_rows(
            session,
            _CHUNKS,
            "INSERT INTO dataset_chunks (owner_id, sha256, size, key_wrapped, stored, "
            '"offset", length, created_at) VALUES (?, ?, ?, ?, FALSE, 0, 0, ?)',
            ("owner_id", "sha256", "size", "key_wrapped", "created_at"),
            [(owner_id, sha, sizes[sha], key, now) for sha, key in zip(new, wrapped, strict=True)],
        )
        new_bytes = sum(sizes[sha] for sha in new)
        quota.add_usage(session, owner_id, new_bytes)
        quota.check_new_content(quota.usage(session, owner_id), quota_bytes, new_bytes)
    missing = new + [sha for sha, stored in known.items() if not stored]
    return Missing(missing, sum(sizes[sha] for sha in missing))


def store_chunks(
    sessions: sessionmaker[Session],
    vault: Vault,
    owner_id: int,
    upload_id: int,
    body: bytes | bytearray | memoryview,
) -> Received:
    """Take a pack of chunks (see gpulease.storage.chunking): check each one's SHA-256,
    seal it under its own key, and store the new ones together as one pack blob (one file
    or object per request, not per chunk: 100,000 small files make a few hundred blobs).
    Chunks the server has already are counted and skipped. Every chunk must have been
    announced by a file list of the push."""
    why = "it was corrupted on the way, or its file changed during the push; push again"
    views = list(unpack_views(body, max_records=MAX_PACK_CHUNKS))
    count, size = len(views), sum(len(data) for _, data in views)
    check_records(views, why)
    records = {digest.hex(): data for digest, data in views}
    # A read-only transaction: it takes no write lock (SQLite), so the pushes and file
    # lists sent beside this pack do not queue behind it; the keys are unwrapped after it.
    wrapped_keys: list[tuple[int, bytes, memoryview, str]] = []
    with transaction(readers(sessions)) as session:
        open_upload(session, owner_id, upload_id)
        # made by the file list that announced the chunks
        user_row = key_row(session, user_scope(owner_id))
        rows = {
            row[0]: row[1:]
            for row in chunk_rows(
                session, owner_id, "sha256, id, size, stored, key_wrapped", sorted(records)
            )
        }
        for sha, data in records.items():
            found = rows.get(sha)
            if found is None or user_row is None:
                raise Conflict(
                    f"chunk {sha} was not announced by a file list of this push; send the "
                    "file list first"
                )
            chunk_id, known_size, stored, wrapped = found
            if known_size != len(data):
                raise InvalidInput(f"chunk {sha} has {len(data)} bytes, not {known_size}")
            if not stored:
                wrapped_keys.append((chunk_id, bytes(wrapped), data, sha))
    placements: list[tuple[str, int, int, int]] = []
    orphan = None
    if wrapped_keys:
        assert user_row is not None
        wrapper = KeyWrapper(vault.ring.unwrap(user_row))
        sealings = [
            (
                wrapper.unwrap(wrapped, chunk_key_scope(owner_id, sha)),
                data,
                chunk_aad(owner_id, sha),
            )
            for _, wrapped, data, sha in wrapped_keys
        ]
        pieces = seal_many(sealings)
        pack_key = f"p/{owner_id}/{secrets.token_hex(16)}"
        offset = 0
        for at, (chunk_id, *_) in enumerate(wrapped_keys):
            length = len(pieces[2 * at]) + len(pieces[2 * at + 1])
            placements.append((pack_key, offset, length, chunk_id))
            offset += length
        vault.store.put_pieces(pack_key, pieces)
        vault.store.sync()
    with transaction(sessions) as session:
        if placements:
            # Where two pushes sent the same chunk at once, the first one recorded wins.
            execute_rows(
                session,
                _CHUNKS,
                'UPDATE dataset_chunks SET stored = TRUE, blob = ?, "offset" = ?, length = ? '
                "WHERE id = ? AND stored = FALSE",
                ("blob", "offset", "length", "id"),
                placements,
            )
            used = session.scalar(select(func.count()).where(_CHUNKS.c.blob == pack_key))
            if not used:  # another push stored all of them first
                orphan = pack_key
        session.execute(
            update(DatasetUpload)
            .where(DatasetUpload.id == upload_id)
            .values(
                chunks_received=DatasetUpload.chunks_received + count,
                bytes_received=DatasetUpload.bytes_received + size,
                updated_at=utcnow(),
            )
            .execution_options(synchronize_session=False)
        )
    if orphan is not None:
        vault.store.delete(orphan)
    return Received(count, size, len(placements))


def refuse_upload(
    sessions: sessionmaker[Session], vault: Vault, owner_id: int, upload_id: int, reason: str
) -> None:
    """Close a push that cannot go on (over quota), and give back what it reserved."""
    with transaction(sessions) as session:
        upload = session.get(DatasetUpload, upload_id)
        if upload is None or upload.state != OPEN:
            return
        staged = close_upload(upload, REFUSED, reason)
    delete_staging(vault, [staged])
    collect_garbage(sessions, vault, owner_id)


def abandon_upload(
    sessions: sessionmaker[Session], vault: Vault, owner: User, upload_id: int
) -> None:
    """Give up a push (the client was interrupted for good). Chunks it sent stay until the
    owner's next garbage collection, so pushing again soon still resumes."""
    with transaction(sessions) as session:
        upload = get_upload(session, owner, upload_id)
        if upload.state != OPEN:
            return
        staged = close_upload(upload, ABANDONED, "abandoned by the client")
    delete_staging(vault, [staged])
