"""Garbage collection: delete the chunks of a user that no live version references."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from gpulease.server.db import batches, transaction
from gpulease.server.orm import Dataset, DatasetChunk, DatasetUpload, DatasetVersion, StorageKey
from gpulease.server.services.datasets.keys import lock_owner
from gpulease.server.services.datasets.quota import add_usage
from gpulease.server.services.datasets.vault import Vault


@dataclass(frozen=True)
class Collected:
    chunks: int
    bytes: int


def _has_open_uploads(session: Session, owner_id: int) -> bool:
    return bool(
        session.scalar(
            select(func.count(DatasetUpload.id)).where(
                DatasetUpload.owner_id == owner_id, DatasetUpload.state == "open"
            )
        )
    )


def _versions_marker(session: Session, owner_id: int) -> tuple[int, int]:
    count, newest = session.execute(
        select(func.count(DatasetVersion.id), func.coalesce(func.max(DatasetVersion.id), 0))
        .join(Dataset, Dataset.id == DatasetVersion.dataset_id)
        .where(Dataset.owner_id == owner_id, Dataset.deleted_at.is_(None))
    ).one()
    return int(count), int(newest)


def collect_garbage(sessions: sessionmaker[Session], vault: Vault, owner_id: int) -> Collected:
    """Mark (read the manifests of owner's live versions), then sweep (delete every chunk
    none of them names: chunks of removed datasets, of refused or abandoned pushes).

    Skipped while owner has a push open: its chunks are referenced by no version yet. The
    sweep holds the owner's storage lock and gives up if a version appeared since the mark,
    so it never deletes a chunk that a commit references. Rows go first, then the pack
    blobs that no row points into any more (a pack partly in use stays whole: its dead
    chunks' space comes back only when all of it is dead).
    """
    with transaction(sessions) as session:
        if _has_open_uploads(session, owner_id):
            return Collected(0, 0)
        marker = _versions_marker(session, owner_id)
        versions = list(
            session.execute(
                select(DatasetVersion.manifest_blob, StorageKey)
                .join(Dataset, Dataset.id == DatasetVersion.dataset_id)
                .join(StorageKey, StorageKey.id == Dataset.key_id)
                .where(Dataset.owner_id == owner_id, Dataset.deleted_at.is_(None))
            )
        )
        keys = {row.id: vault.ring.unwrap(row) for _, row in versions}
        manifests = [(blob, keys[row.id]) for blob, row in versions]
    live: set[str] = set()
    for blob, key in manifests:
        live |= vault.version_chunks(blob, key)
    with transaction(sessions) as session:
        lock_owner(session, vault.ring, owner_id)
        if _has_open_uploads(session, owner_id) or _versions_marker(session, owner_id) != marker:
            return Collected(0, 0)
        dead = [
            (chunk_id, blob, size)
            for chunk_id, sha, blob, size in session.execute(
                select(
                    DatasetChunk.id, DatasetChunk.sha256, DatasetChunk.blob, DatasetChunk.size
                ).where(DatasetChunk.owner_id == owner_id)
            )
            if sha not in live
        ]
        ids = [chunk_id for chunk_id, _, _ in dead]
        add_usage(session, owner_id, -sum(size for _, _, size in dead))
        for batch in batches(ids):
            session.execute(
                delete(DatasetChunk)
                .where(DatasetChunk.id.in_(batch))
                .execution_options(synchronize_session=False)
            )
        packs = sorted({blob for _, blob, _ in dead if blob is not None})
        still_used: set[str] = set()
        for some in batches(packs):
            still_used.update(
                blob
                for blob in session.scalars(
                    select(DatasetChunk.blob).where(DatasetChunk.blob.in_(some)).distinct()
                )
                if blob is not None
            )
    for pack in packs:
        if pack not in still_used:
            vault.store.delete(pack)
    return Collected(len(dead), sum(size for _, _, size in dead))
