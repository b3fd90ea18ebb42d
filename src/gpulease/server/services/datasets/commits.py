"""Committing a push: its file lists become a new version of the dataset, whole or not at all."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpulease.core.datasets import format_bytes, manifest_digest, tree_conflict
from gpulease.core.errors import Conflict, InvalidInput
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Dataset, DatasetVersion
from gpulease.server.services.datasets import quota
from gpulease.server.services.datasets.bulk import chunk_rows
from gpulease.server.services.datasets.keys import lock_owner
from gpulease.server.services.datasets.uploads import (
    COMMITTED,
    MAX_PARTS,
    close_upload,
    dataset_key_of,
    delete_staging,
    digest_in_manifest_key,
    manifest_key,
    open_upload,
    refuse_upload,
    staging_key,
)
from gpulease.server.services.datasets.vault import Manifest, ManifestFile, Vault


def _read_parts(
    vault: Vault, dataset_key: bytes, owner_id: int, upload_id: int, parts: int
) -> Manifest:
    files: list[ManifestFile] = []
    for part in range(parts):
        key = staging_key(owner_id, upload_id, part)
        if not vault.store.exists(key):
            raise InvalidInput(f"part {part} of the file list never arrived; push again")
        files.extend(vault.read_manifest(dataset_key, key).files)
    files.sort(key=lambda f: f.path)
    return Manifest(tuple(files))


def _same_as_current(
    sessions: sessionmaker[Session], vault: Vault, owner_id: int, upload_id: int, digest: str
) -> DatasetVersion | None:
    """When the push lists exactly the dataset's current version, close it as committed to
    that version (no new version) and return the version; else None."""
    with transaction(sessions) as session:
        upload = open_upload(session, owner_id, upload_id)
        dataset = session.get(Dataset, upload.dataset_id, with_for_update=True)
        assert dataset is not None
        if dataset.current_version is None:
            return None
        current = session.scalar(
            select(DatasetVersion).where(
                DatasetVersion.dataset_id == dataset.id,
                DatasetVersion.number == dataset.current_version,
            )
        )
        if current is None or digest_in_manifest_key(current.manifest_blob) != digest:
            return None
        upload.files_listed = current.file_count
        upload.version = current.number
        staged = close_upload(upload, COMMITTED, f"unchanged: the same files as v{current.number}")
    delete_staging(vault, [staged])
    return current


def _changed(base: Manifest, number: int, changes: Manifest, removed: Sequence[str]) -> Manifest:
    """Version `number` (base) with the files listed in a push that changes it (changes:
    new files, and files that replace its own) and without the removed ones."""
    files = {f.path: f for f in base.files}
    listed = {f.path for f in changes.files}
    if len(listed) != len(changes.files):
        problem = tree_conflict([f.path for f in changes.files])
        raise InvalidInput(f"the file list does not make a directory tree: {problem}")
    for path in removed:
        if path in listed:
            raise InvalidInput(f"{path!r} is both listed and removed; send it once")
        if files.pop(path, None) is None:
            raise InvalidInput(
                f"{path!r} is not a file of version {number}, so it cannot be removed from it"
            )
    files.update((f.path, f) for f in changes.files)
    return Manifest(tuple(sorted(files.values(), key=itemgetter(0))))


def _base_blob(session: Session, dataset: Dataset, number: int) -> str:
    """The manifest blob of the dataset's version `number`, the base of a push."""
    blob = session.scalar(
        select(DatasetVersion.manifest_blob).where(
            DatasetVersion.dataset_id == dataset.id, DatasetVersion.number == number
        )
    )
    if blob is None:
        raise InvalidInput(
            f"dataset {dataset.name} has no version {number} to change; push the whole "
            "tree (no base version)"
        )
    return blob


def commit_upload(
    sessions: sessionmaker[Session],
    vault: Vault,
    owner_id: int,
    upload_id: int,
    *,
    parts: int,
    files: int,
    size: int,
    quota_bytes: int,
    base_version: int | None = None,
    removed: Sequence[str] = (),
) -> DatasetVersion:
    """Make the push a new version of its dataset: every file listed in parts 0..parts-1,
    every chunk of them stored; with base_version, those files and the files of that
    version that they neither replace nor remove. files and size must match
    the new version (a check that client and server agree on the whole push). Nothing is
    visible before this returns."""
    with transaction(sessions) as session:
        upload = open_upload(session, owner_id, upload_id)
        dataset = session.get(Dataset, upload.dataset_id)
        assert dataset is not None
        dataset_id = dataset.id
        dataset_key = dataset_key_of(session, vault.ring, dataset)
        base_blob = None if base_version is None else _base_blob(session, dataset, base_version)
    if not 0 <= parts <= MAX_PARTS:
        raise InvalidInput(f"parts must be between 0 and {MAX_PARTS}")
    if removed and base_version is None:
        raise InvalidInput("removed files need the base version they are removed from")
    manifest = _read_parts(vault, dataset_key, owner_id, upload_id, parts)
    # The chunks to check for at the end. Of a push that changes a version, only those of its
    # own file lists: every chunk of a committed version is stored, a stored chunk never
    # becomes unstored, and garbage collection, the only thing that deletes chunks, deletes
    # none of a live version's, and none of the owner's while a push of theirs is open (this
    # one is, until the transaction below closes it, and it checks the dataset is still live).
    arriving = chunks = manifest.chunk_ids()
    if base_blob is not None and base_version is not None:
        base = vault.read_manifest(dataset_key, base_blob)
        manifest = _changed(base, base_version, manifest, removed)
        chunks = manifest.chunk_ids()
    problem = tree_conflict([f.path for f in manifest.files])
    if problem:
        raise InvalidInput(f"the file list does not make a directory tree: {problem}")
    if len(manifest.files) != files or manifest.size != size:
        raise InvalidInput(
            f"the server got {len(manifest.files)} files, {manifest.size} bytes in the file "
            f"lists, but the commit says {files} files, {size} bytes; push again"
        )
    digest = manifest_digest((f.path, f.size, f.chunks) for f in manifest.files)
    same = _same_as_current(sessions, vault, owner_id, upload_id, digest)
    if same is not None:
        return same
    blob = manifest_key(owner_id, dataset_id, upload_id, digest)
    vault.seal_blob(dataset_key, blob, manifest.encode())
    vault.store.sync()
    try:
        with transaction(sessions) as session:
            lock_owner(session, vault.ring, owner_id)
            upload = open_upload(session, owner_id, upload_id)
            dataset = session.get(Dataset, upload.dataset_id, with_for_update=True)
            assert dataset is not None
            if dataset.deleted_at is not None:
                raise Conflict(f"dataset {dataset.name} was removed during the push")
            checked = sorted(arriving)
            # counted by the database, 500 hashes a query: no row per chunk comes back
            have = sum(
                row[0] for row in chunk_rows(session, owner_id, "count(*)", checked, "stored")
            )
            lacking = len(checked) - have
            if lacking:
                raise Conflict(
                    f"{lacking} chunks of this push have not arrived; push again to send them"
                )
            used = quota.usage(session, owner_id)
            if used > quota_bytes:
                raise quota.QuotaExceeded(
                    f"you use {format_bytes(used)} of your {format_bytes(quota_bytes)} "
                    f"storage quota (other pushes filled it meanwhile); {quota.HINT}"
                )
            number = (
                session.scalar(
                    select(func.max(DatasetVersion.number)).where(
                        DatasetVersion.dataset_id == dataset.id
                    )
                )
                or 0
            ) + 1
            now = utcnow()
            version = DatasetVersion(
                dataset_id=dataset.id,
                number=number,
                file_count=len(manifest.files),
                size_bytes=manifest.size,
                chunk_count=len(chunks),
                manifest_blob=blob,
                upload_id=upload.id,
                created_at=now,
            )
            session.add(version)
            dataset.current_version = number
            dataset.file_count = version.file_count
            dataset.size_bytes = version.size_bytes
            dataset.updated_at = now
            upload.files_listed = len(manifest.files)
            upload.version = number
            staged = close_upload(upload, COMMITTED, "")
    except quota.QuotaExceeded as exc:
        vault.store.delete(blob)
        refuse_upload(sessions, vault, owner_id, upload_id, exc.message)
        raise
    except BaseException:
        vault.store.delete(blob)
        raise
    delete_staging(vault, [staged])
    return version
