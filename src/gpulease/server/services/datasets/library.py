"""A user's datasets: list, show, remove, and the storage they use."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpulease.core.datasets import check_dataset_name
from gpulease.core.errors import Conflict, NotFound
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import (
    Dataset,
    DatasetUpload,
    DatasetVersion,
    Instance,
    InstanceDataset,
    StorageKey,
    User,
)
from gpulease.server.services.datasets.garbage import Collected, collect_garbage
from gpulease.server.services.datasets.uploads import ABANDONED, OPEN, close_upload, delete_staging
from gpulease.server.services.datasets.vault import Vault
from gpulease.server.services.instances.states import RELEASED


def list_datasets(session: Session, owner: User) -> list[Dataset]:
    """owner's datasets that have a version (a first push still in progress does not show)."""
    return list(
        session.scalars(
            select(Dataset)
            .where(
                Dataset.owner_id == owner.id,
                Dataset.deleted_at.is_(None),
                Dataset.current_version.is_not(None),
            )
            .order_by(Dataset.name)
        )
    )


def get_dataset(session: Session, owner: User, name: str) -> Dataset:
    """owner's dataset called name. Someone else's, or one without a version yet, is simply
    not found."""
    check_dataset_name(name)
    dataset = session.scalar(
        select(Dataset).where(
            Dataset.owner_id == owner.id,
            Dataset.name == name,
            Dataset.deleted_at.is_(None),
            Dataset.current_version.is_not(None),
        )
    )
    if dataset is None:
        raise NotFound(f"you have no dataset {name!r}; see `gpulease dataset ls`")
    return dataset


def current_version(session: Session, owner: User, name: str) -> tuple[Dataset, DatasetVersion]:
    """owner's dataset called name and its current version (not found as get_dataset)."""
    dataset = get_dataset(session, owner, name)
    version = session.scalar(
        select(DatasetVersion).where(
            DatasetVersion.dataset_id == dataset.id,
            DatasetVersion.number == dataset.current_version,
        )
    )
    assert version is not None, "a dataset's current version exists"
    return dataset, version


def dataset_of(session: Session, version: DatasetVersion) -> Dataset:
    """The dataset a version belongs to (as it is now: a commit updates its totals)."""
    dataset = session.get(Dataset, version.dataset_id)
    assert dataset is not None, "a version always belongs to a dataset"
    return dataset


def versions(session: Session, dataset: Dataset) -> list[DatasetVersion]:
    return list(
        session.scalars(
            select(DatasetVersion)
            .where(DatasetVersion.dataset_id == dataset.id)
            .order_by(DatasetVersion.number.desc())
        )
    )


def recent_uploads(session: Session, dataset: Dataset, limit: int = 5) -> list[DatasetUpload]:
    return list(
        session.scalars(
            select(DatasetUpload)
            .where(DatasetUpload.dataset_id == dataset.id)
            .order_by(DatasetUpload.id.desc())
            .limit(limit)
        )
    )


def mounting_instances(session: Session, dataset: Dataset) -> list[str]:
    """Names of the instances (not released) that mount dataset."""
    return list(
        session.scalars(
            select(Instance.name)
            .join(InstanceDataset, InstanceDataset.instance_id == Instance.id)
            .where(InstanceDataset.dataset_id == dataset.id, Instance.status != RELEASED)
            .order_by(Instance.id)
        )
    )


def remove_dataset(
    sessions: sessionmaker[Session], vault: Vault, owner: User, name: str
) -> Collected:
    """Remove a dataset with all its versions. Its key is destroyed (its manifests become
    unreadable everywhere), then its chunks that no other dataset of owner uses are deleted.
    Refused while an instance that is not released mounts it."""
    with transaction(sessions) as session:
        dataset = get_dataset(session, owner, name)
        users = mounting_instances(session, dataset)
        if users:
            raise Conflict(
                f"dataset {name} is mounted by instance(s) {', '.join(users)}; release them "
                "first (`gpulease instance release NAME`)"
            )
        manifests = [v.manifest_blob for v in versions(session, dataset)]
        staged = [
            close_upload(upload, ABANDONED, "its dataset was removed")
            for upload in session.scalars(
                select(DatasetUpload).where(
                    DatasetUpload.dataset_id == dataset.id, DatasetUpload.state == OPEN
                )
            )
        ]
        dataset.deleted_at = utcnow()
        key = session.get(StorageKey, dataset.key_id) if dataset.key_id else None
        dataset.key_id = None
        session.flush()
        if key is not None:
            session.delete(key)
    for blob in manifests:
        vault.store.delete(blob)
    delete_staging(vault, staged)
    return collect_garbage(sessions, vault, owner.id)
