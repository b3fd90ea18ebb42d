"""Wire models for datasets, their versions and chunked uploads."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, Field

from gpulease.schemas.base import Count, Id, Model


class DatasetPublic(Model):
    id: int
    name: str
    current_version: int | None
    file_count: int
    size_bytes: int
    created_at: datetime
    updated_at: datetime


class DatasetVersionPublic(Model):
    number: int
    file_count: int
    size_bytes: int
    chunk_count: int
    created_at: datetime


class DatasetUploadPublic(Model):
    id: int
    dataset_id: int
    state: str
    state_reason: str
    declared_files: int
    declared_bytes: int
    parts: int
    files_listed: int
    chunks_received: int
    bytes_received: int
    """What the server received through this push: a resumed push sends only the rest."""
    version: int | None
    created_at: datetime
    updated_at: datetime


class DatasetCurrent(BaseModel):
    """A dataset's current version, and the digest of its manifest (core/datasets.py
    manifest_digest; None for a version committed before digests were kept): a client whose
    tree has this digest has nothing to push."""

    dataset: DatasetPublic
    manifest_sha256: str | None
    changes_taken: bool = False
    """The server takes a push that changes this version (DatasetCommit.base_version);
    servers from before such pushes answer without it, and are sent whole trees."""


class DatasetDetail(BaseModel):
    dataset: DatasetPublic
    versions: list[DatasetVersionPublic]
    pushes: list[DatasetUploadPublic]
    mounted_by: list[str]


class StorageUsage(BaseModel):
    used_bytes: int
    quota_bytes: int


class DatasetList(BaseModel):
    datasets: list[DatasetPublic]
    usage: StorageUsage


class DatasetUploadCreate(BaseModel):
    name: str = Field(max_length=1000)  # the service says what a valid name is
    files: Count
    bytes: Count


class DatasetFileEntry(BaseModel):
    path: str = Field(max_length=4096)
    size: Count
    chunks: list[str] = Field(max_length=1_000_000)
    """SHA-256 (hex) of each 4 MiB chunk, in order; none for an empty file."""


class DatasetFilesPart(BaseModel):
    files: list[DatasetFileEntry] = Field(max_length=10_000)


class DatasetMissingChunks(BaseModel):
    missing: list[str]
    missing_bytes: int


class DatasetChunksReceived(BaseModel):
    chunks: int
    bytes: int
    new_chunks: int


# The most paths one commit may name as removed from its base version (more: push whole).
MAX_REMOVED = 10_000


class DatasetCommit(BaseModel):
    parts: Count
    files: Count
    bytes: Count
    base_version: Id | None = None
    """When set, the push changes that version of the dataset: its file lists hold only the
    files that are new or differ from it, `removed` names its files that are gone, and the
    new version is the two together. files and bytes are the new version's, whole."""
    removed: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list, max_length=MAX_REMOVED
    )


class DatasetRemoved(BaseModel):
    name: str
    freed_chunks: int
    freed_bytes: int
