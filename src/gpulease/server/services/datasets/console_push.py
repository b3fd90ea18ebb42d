"""Pushing a small set of files in one go (the console's upload form), through the same
steps as a CLI push: start, file list, chunks, commit."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from gpulease.core.datasets import check_path, format_bytes
from gpulease.core.errors import InvalidInput
from gpulease.server.orm import DatasetVersion, User
from gpulease.server.services.datasets import commits, uploads
from gpulease.server.services.datasets.vault import Vault
from gpulease.storage.chunking import CHUNK_SIZE, chunk_digests, pack

MAX_FILES = 1000
MAX_BYTES = 100_000_000


def push_files(
    sessions: sessionmaker[Session],
    vault: Vault,
    owner: User,
    name: str,
    files: list[tuple[str, bytes]],
    *,
    quota_bytes: int,
) -> DatasetVersion:
    """files: (path inside the dataset, content). At most MAX_FILES, MAX_BYTES in all;
    bigger sets go with `gpulease dataset push`."""
    if not files:
        raise InvalidInput("choose at least one file to upload")
    size = sum(len(data) for _, data in files)
    if len(files) > MAX_FILES or size > MAX_BYTES:
        raise InvalidInput(
            f"the console takes up to {MAX_FILES} files and {format_bytes(MAX_BYTES)} at once "
            f"(this is {len(files)} files, {format_bytes(size)}); use "
            f"`gpulease dataset push DIR --name {name}` for bigger sets"
        )
    for path, _ in files:
        check_path(path)
    upload = uploads.start_upload(
        sessions, vault, owner, name, files=len(files), size=size, quota_bytes=quota_bytes
    )
    chunks: dict[str, bytes] = {}
    entries = []
    for path, data in files:
        refs = chunk_digests(data)
        entries.append(uploads.FileEntry(path, len(data), tuple(r.sha256 for r in refs)))
        for index, ref in enumerate(refs):
            start = index * CHUNK_SIZE
            chunks.setdefault(ref.sha256, data[start : start + ref.size])
    try:
        missing = uploads.add_files(
            sessions, vault, owner.id, upload.id, 0, entries, quota_bytes=quota_bytes
        )
        batch: list[tuple[str, bytes]] = []
        batch_size = 0
        for sha in missing.chunks:
            batch.append((sha, chunks[sha]))
            batch_size += len(chunks[sha])
            if batch_size >= 16 * 1024 * 1024:
                uploads.store_chunks(sessions, vault, owner.id, upload.id, pack(batch))
                batch, batch_size = [], 0
        if batch:
            uploads.store_chunks(sessions, vault, owner.id, upload.id, pack(batch))
        return commits.commit_upload(
            sessions,
            vault,
            owner.id,
            upload.id,
            parts=1,
            files=len(files),
            size=size,
            quota_bytes=quota_bytes,
        )
    except BaseException:
        uploads.abandon_upload(sessions, vault, owner, upload.id)
        raise
