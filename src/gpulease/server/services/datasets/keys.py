"""The key hierarchy of datasets at rest, and master key rotation.

    master key            a file outside the database (GPULEASE_MASTER_KEY_FILE, mode 0600)
      ├─ user key         one per user, row `storage_keys` scope 'user:ID'
      │    └─ chunk key   one random 256-bit key per chunk, row `dataset_chunks.key_wrapped`
      │         └─ chunk  sealed with it, inside a pack blob `p/OWNER/RANDOM` (the chunks
      │                   that arrived in one request, each sealed on its own)
      └─ dataset key      one per dataset, row `storage_keys` scope 'dataset:ID'
           └─ manifest    paths, sizes and chunk ids of a version, blob `m/OWNER/DATASET/UPLOAD`

Why chunk keys hang off a *user* key and not off the dataset key: a user's pushes are
deduplicated across all their datasets (a chunk with the same plaintext SHA-256 is stored
once per user), so a chunk outlives any one dataset, and it needs exactly one wrapped key
that every dataset of its owner can reach. Deduplication never crosses users: the same file
pushed by two users is two chunks under two unrelated random keys, so neither the blob store
nor the database tells anyone which users hold the same file. The dataset key seals what
says most about a dataset, its file names and layout; removing a dataset destroys its key,
so its manifests are unreadable everywhere, also in old backups of the blob store.

Every wrap and seal carries its place in its associated data ('user:5', the chunk's owner and
hash, the manifest's blob key), so nothing can be moved to another user or dataset and still
open. The database alone (without the master key file) reads nothing; the master key alone
(without the database) reads nothing either.

One row of `storage_keys`, scope 'master', names the master key in force (`master_key_id`)
and holds a wrapped random key as a canary: a server whose key file does not open it refuses
to start ("the master key file does not match this database"), and a server that wraps a new
key first locks that row and checks it still names the key it holds.

Rotation (`gpulease admin rotate-master-key`, on the server host) writes the new master key
beside the old one (`master.key.new`), re-wraps every row of `storage_keys` (the 'master'
row included, under its lock) in one transaction, and only after that commit replaces the
old key file with the new one. Chunk keys and blobs stay as they are: they sit below the
user keys, which do not change. A running server notices the change at its next wrap or at
an unknown key id and reloads the key files, so rotating under a live server is safe. A
server that finds a `.new` file at start settles an interrupted rotation by what the
'master' row names.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError as DbIntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import StorageKey
from gpulease.storage.crypto import (
    IntegrityError,
    KeyFileError,
    MasterKey,
    fsync_directory,
    load_or_create_master_key,
    new_key,
    pending_key_path,
    read_master_key,
    unwrap_key,
    wrap_key,
    write_master_key,
)

log = logging.getLogger(__name__)


MASTER_SCOPE = "master"


class KeyRing:
    """The master key a server wraps with, and the others it can still unwrap with (a
    rotation's pending key). With a path it re-reads the key files when it meets a key id
    it does not know, or when the database names another master key than its own."""

    def __init__(
        self, current: MasterKey, others: Iterable[MasterKey] = (), path: Path | None = None
    ) -> None:
        self.current = current
        self.path = path
        self._by_id = {k.key_id: k for k in (*others, current)}
        self._lock = threading.Lock()

    def reload(self) -> None:
        if self.path is None:
            return
        current = read_master_key(self.path)
        pending = pending_key_path(self.path)
        others = [read_master_key(pending)] if pending.exists() else []
        with self._lock:
            self.current = current
            self._by_id = {k.key_id: k for k in (*others, current)}

    def master_for(self, key_id: str) -> MasterKey:
        found = self._by_id.get(key_id)
        if found is None:
            self.reload()
            found = self._by_id.get(key_id)
        if found is None:
            raise IntegrityError(
                f"a key is wrapped by master key {key_id}, which this server does not have "
                f"(it has {self.current.key_id}); restore the master key file that matches "
                "this database"
            )
        return found

    def unwrap(self, row: StorageKey) -> bytes:
        return unwrap_key(self.master_for(row.master_key_id).secret, row.wrapped, row.scope)

    def wrap_with(self, master: MasterKey, key: bytes, scope: str) -> tuple[bytes, str]:
        return wrap_key(master.secret, key, scope), master.key_id


def master_in_force(session: Session, ring: KeyRing) -> MasterKey:
    """The master key to wrap new keys with in this transaction: the one the database's
    'master' row names, with that row locked until the transaction ends (so a rotation
    cannot re-wrap the rows between our wrap and our commit). Made at the first start."""
    row = session.scalar(
        select(StorageKey).where(StorageKey.scope == MASTER_SCOPE).with_for_update()
    )
    if row is None:
        master = ring.current
        wrapped, key_id = ring.wrap_with(master, new_key(), MASTER_SCOPE)
        try:
            with session.begin_nested():
                session.add(
                    StorageKey(
                        scope=MASTER_SCOPE,
                        owner_id=None,
                        wrapped=wrapped,
                        master_key_id=key_id,
                        created_at=utcnow(),
                    )
                )
        except DbIntegrityError:
            return master_in_force(session, ring)
        return master
    master = ring.master_for(row.master_key_id)
    ring.unwrap(row)  # the canary: the key file must open it
    return master


def user_scope(owner_id: int) -> str:
    return f"user:{owner_id}"


def dataset_scope(dataset_id: int) -> str:
    return f"dataset:{dataset_id}"


def chunk_key_scope(owner_id: int, sha256: str) -> str:
    return f"chunk:{owner_id}:{sha256}"


def key_row(session: Session, scope: str) -> StorageKey | None:
    """The key row of scope, or None when it was never made."""
    return session.scalar(select(StorageKey).where(StorageKey.scope == scope))


def ensure_key(session: Session, ring: KeyRing, scope: str, owner_id: int) -> StorageKey:
    """The key row of scope, made (a fresh random key) if there is none yet. Safe when two
    requests make it at once: the loser reads the winner's row."""
    row = key_row(session, scope)
    if row is not None:
        return row
    wrapped, key_id = ring.wrap_with(master_in_force(session, ring), new_key(), scope)
    try:
        with session.begin_nested():
            row = StorageKey(
                scope=scope,
                owner_id=owner_id,
                wrapped=wrapped,
                master_key_id=key_id,
                created_at=utcnow(),
            )
            session.add(row)
    except DbIntegrityError:
        row = key_row(session, scope)
        assert row is not None
    return row


def lock_owner(session: Session, ring: KeyRing, owner_id: int) -> bytes:
    """Take the owner's storage lock for this transaction (their user key row, FOR UPDATE
    on Postgres; SQLite serialises writers anyway) and return the user key. Pushes,
    commits and garbage collection of one user take it, so a collection never deletes a
    chunk that a commit is about to reference."""
    row = ensure_key(session, ring, user_scope(owner_id), owner_id)
    session.execute(select(StorageKey.id).where(StorageKey.id == row.id).with_for_update()).all()
    return ring.unwrap(row)


def user_key(session: Session, ring: KeyRing, owner_id: int) -> bytes:
    return ring.unwrap(ensure_key(session, ring, user_scope(owner_id), owner_id))


def open_key_ring(path: Path) -> KeyRing:
    """The master key in path (made at the first start), plus a rotation's pending key when
    one was interrupted (see finish_rotation)."""
    current, created = load_or_create_master_key(path)
    if created:
        log.warning("created the master key %s (back it up apart from the database)", path)
    pending = pending_key_path(path)
    others = [read_master_key(pending)] if pending.exists() else []
    return KeyRing(current, others, path)


def _named_master(sessions: sessionmaker[Session]) -> str | None:
    with transaction(sessions) as session:
        return session.scalar(
            select(StorageKey.master_key_id).where(StorageKey.scope == MASTER_SCOPE)
        )


def finish_rotation(sessions: sessionmaker[Session], path: Path) -> KeyRing:
    """The key ring of a starting server. Settles a rotation that stopped halfway (if the
    database names the pending key, the commit happened and the pending file becomes the
    master key; otherwise it is dropped), and checks that the key file opens this
    database's keys."""
    ring = open_key_ring(path)
    pending = pending_key_path(path)
    named = _named_master(sessions)
    if pending.exists():
        new = read_master_key(pending)
        if named == new.key_id:
            pending.replace(path)
            log.warning("finished an interrupted master key rotation: %s is in use", new.key_id)
        else:
            pending.unlink()
            log.warning("dropped the key of a master key rotation that did not commit")
        fsync_directory(path.parent)
        ring = open_key_ring(path)
    with transaction(sessions) as session:
        if named is not None and named != ring.current.key_id:
            raise KeyFileError(
                f"the master key file {path} (key {ring.current.key_id}) does not match this "
                f"database, whose keys are wrapped by master key {named}; restore the right "
                "key file (or point GPULEASE_MASTER_KEY_FILE at it)"
            )
        master_in_force(session, ring)
    return ring


@dataclass(frozen=True)
class Rotation:
    old_key_id: str
    new_key_id: str
    rewrapped: int


def rotate_master_key(sessions: sessionmaker[Session], path: Path) -> Rotation:
    """Re-wrap every storage key under a new master key; see the module docstring for the
    order that keeps the data readable whatever step a crash interrupts."""
    ring = finish_rotation(sessions, path)
    old = ring.current
    new = MasterKey(new_key())
    pending = pending_key_path(path)
    write_master_key(pending, new)
    count = 0
    try:
        with transaction(sessions) as session:
            # Lock in the order everyone else does (a user's row, then 'master'), so that a
            # push creating a key meanwhile waits instead of deadlocking with the rotation.
            session.execute(
                select(StorageKey.id)
                .where(StorageKey.scope != MASTER_SCOPE)
                .order_by(StorageKey.id)
                .with_for_update()
            ).all()
            master_in_force(session, ring)
            now = utcnow()
            for row in session.scalars(select(StorageKey).order_by(StorageKey.id)):
                key = ring.unwrap(row)
                row.wrapped, row.master_key_id = ring.wrap_with(new, key, row.scope)
                row.rotated_at = now
                count += 1
    except BaseException:
        pending.unlink(missing_ok=True)
        raise
    pending.replace(path)
    fsync_directory(path.parent)
    return Rotation(old.key_id, new.key_id, count)


__all__ = [
    "MASTER_SCOPE",
    "IntegrityError",
    "KeyFileError",
    "KeyRing",
    "Rotation",
    "chunk_key_scope",
    "dataset_scope",
    "ensure_key",
    "finish_rotation",
    "lock_owner",
    "master_in_force",
    "open_key_ring",
    "rotate_master_key",
    "user_key",
    "user_scope",
]
