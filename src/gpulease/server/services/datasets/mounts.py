"""Datasets mounted by instances: attaching them at create time, and what runners fetch."""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpulease.core.errors import InvalidInput, NotFound
from gpulease.schemas.runner import RunnerDatasetMount
from gpulease.server.db import transaction
from gpulease.server.orm import (
    Dataset,
    DatasetVersion,
    Instance,
    InstanceDataset,
    User,
)
from gpulease.server.services.datasets.bulk import chunk_rows
from gpulease.server.services.datasets.keys import chunk_key_scope, user_key
from gpulease.server.services.datasets.library import get_dataset
from gpulease.server.services.datasets.uploads import dataset_key_of
from gpulease.server.services.datasets.vault import ManifestFile, Vault
from gpulease.storage import file_lists
from gpulease.storage.chunking import pack
from gpulease.storage.crypto import KeyWrapper

MAX_FETCH_CHUNKS = 4096
FILE_LIST_BLOCK_FILES = 1024  # files a block of a runner's file list holds


def attach_datasets(session: Session, owner: User, instance: Instance, names: list[str]) -> None:
    """Mount owner's datasets `names` in instance at /data/NAME, each at its current version.
    Another user's dataset is not found, as if it did not exist."""
    if len(set(names)) != len(names):
        raise InvalidInput("a dataset is listed twice; mount each dataset once")
    for name in names:
        dataset = get_dataset(session, owner, name)
        assert dataset.current_version is not None
        session.add(
            InstanceDataset(
                instance_id=instance.id,
                dataset_id=dataset.id,
                name=dataset.name,
                version=dataset.current_version,
            )
        )
    session.flush()


def instance_mounts(session: Session, instance_id: int) -> list[RunnerDatasetMount]:
    """The versions the instance mounts, as its runner is told them."""
    rows = session.execute(
        select(InstanceDataset, Dataset, DatasetVersion)
        .join(Dataset, Dataset.id == InstanceDataset.dataset_id)
        .join(
            DatasetVersion,
            (DatasetVersion.dataset_id == Dataset.id)
            & (DatasetVersion.number == InstanceDataset.version),
        )
        .where(InstanceDataset.instance_id == instance_id)
        .order_by(InstanceDataset.name)
    )
    return [
        RunnerDatasetMount(
            name=mount.name,
            dataset_id=dataset.id,
            owner_id=dataset.owner_id,
            version=mount.version,
            file_count=version.file_count,
            size_bytes=version.size_bytes,
        )
        for mount, dataset, version in rows
    ]


def _mounted_version(
    session: Session, instance: Instance, dataset_id: int, number: int
) -> tuple[Dataset, DatasetVersion]:
    found = session.execute(
        select(Dataset, DatasetVersion)
        .join(InstanceDataset, InstanceDataset.dataset_id == Dataset.id)
        .join(
            DatasetVersion,
            (DatasetVersion.dataset_id == Dataset.id)
            & (DatasetVersion.number == InstanceDataset.version),
        )
        .where(
            InstanceDataset.instance_id == instance.id,
            InstanceDataset.dataset_id == dataset_id,
            InstanceDataset.version == number,
            Dataset.deleted_at.is_(None),
        )
    ).first()
    if found is None:
        raise NotFound(f"dataset {dataset_id} version {number} is not mounted by this instance")
    dataset, version = found
    return dataset, version


def runner_file_list(
    sessions: sessionmaker[Session],
    vault: Vault,
    instance: Instance,
    dataset_id: int,
    number: int,
    start: int = 0,
) -> Iterator[bytes]:
    """A mounted version's files from the start-th on, with the keys of their chunks, for
    the instance's runner (it decrypts and checks every chunk itself), as the pieces of a
    file list (storage/file_lists.py). What is refused is refused here; the blocks are made
    as they are read, each with its own short transaction."""
    with transaction(sessions) as session:
        dataset, version = _mounted_version(session, instance, dataset_id, number)
        dataset_key = dataset_key_of(session, vault.ring, dataset)
        owner_id = dataset.owner_id
        blob = version.manifest_blob
        ukey = user_key(session, vault.ring, owner_id)
    manifest = vault.read_manifest(dataset_key, blob)
    vault.version_chunks(blob, dataset_key, manifest)  # for the chunk requests that follow
    files = manifest.files
    if start > len(files):
        raise InvalidInput(f"start {start} is past the {len(files)} files of this version")
    return _file_list(sessions, KeyWrapper(ukey), owner_id, files, start)


def _file_list(
    sessions: sessionmaker[Session],
    wrapper: KeyWrapper,
    owner_id: int,
    files: tuple[ManifestFile, ...],
    start: int,
) -> Iterator[bytes]:
    yield file_lists.header(len(files), start)
    at = start
    while at < len(files):
        chosen = files[at : at + FILE_LIST_BLOCK_FILES]
        at += len(chosen)
        shas = [sha for f in chosen for sha in f.chunks]
        keys: dict[str, bytes] = {}
        with transaction(sessions) as session:
            rows = list(chunk_rows(session, owner_id, "sha256, key_wrapped", sorted(set(shas))))
        for sha, wrapped in rows:
            keys[sha] = wrapper.unwrap(bytes(wrapped), chunk_key_scope(owner_id, sha))
        lacking = [sha for sha in shas if sha not in keys]
        if lacking:  # the stream is cut short: the runner sees no end and gives up
            raise NotFound(f"chunk {lacking[0]} of this dataset version has no key")
        yield file_lists.block(
            [f.path for f in chosen],
            [f.size for f in chosen],
            [len(f.chunks) for f in chosen],
            bytes.fromhex("".join(shas)),
            b"".join([keys[sha] for sha in shas]),
        )
    yield file_lists.END


def runner_chunks(
    sessions: sessionmaker[Session],
    vault: Vault,
    instance: Instance,
    dataset_id: int,
    number: int,
    wanted: list[str],
) -> bytes:
    """A pack of the sealed chunks `wanted` of a version the instance mounts."""
    if len(wanted) > MAX_FETCH_CHUNKS:
        raise InvalidInput(f"ask for at most {MAX_FETCH_CHUNKS} chunks at a time")
    with transaction(sessions) as session:
        dataset, version = _mounted_version(session, instance, dataset_id, number)
        dataset_key = dataset_key_of(session, vault.ring, dataset)
        owner_id = dataset.owner_id
        blob = version.manifest_blob
    allowed = vault.version_chunks(blob, dataset_key)
    outside = [sha for sha in wanted if sha not in allowed]
    if outside:
        raise NotFound(f"chunk {outside[0]} is not part of this dataset version")
    places: dict[str, tuple[str, int, int]] = {}
    with transaction(sessions) as session:
        columns = 'sha256, blob, "offset", length'
        for sha, stored_in, offset, length in chunk_rows(
            session, owner_id, columns, sorted(set(wanted)), "stored"
        ):
            assert stored_in is not None
            places[sha] = (stored_in, offset, length)
    lost = [sha for sha in wanted if sha not in places]
    if lost:
        raise NotFound(f"chunk {lost[0]} of this dataset version is missing from storage")
    by_pack: dict[str, list[tuple[int, int, str]]] = {}
    for sha in dict.fromkeys(wanted):
        pack_key, offset, length = places[sha]
        by_pack.setdefault(pack_key, []).append((offset, length, sha))
    sealed: dict[str, bytes] = {}
    for pack_key, spots in by_pack.items():
        sealed.update(_read_sealed(vault, pack_key, spots))
    return pack((sha, sealed[sha]) for sha in wanted)


def _read_sealed(
    vault: Vault, pack_key: str, spots: list[tuple[int, int, str]]
) -> dict[str, bytes]:
    """The sealed chunks at spots (offset, length, sha256) of one pack blob, the chunks that
    lie back to back read as one range (a push stores a pack's chunks so, in file order:
    one read instead of a thousand)."""
    spots.sort()
    ranges: list[list[int]] = []  # [offset, length] of each run of adjacent chunks
    for offset, length, _ in spots:
        if ranges and sum(ranges[-1]) == offset:
            ranges[-1][1] += length
        else:
            ranges.append([offset, length])
    found: dict[str, bytes] = {}
    at = 0
    for (start, _), data in zip(
        ranges, vault.store.read_ranges(pack_key, [(o, n) for o, n in ranges]), strict=True
    ):
        view = memoryview(data)
        while at < len(spots) and spots[at][0] < start + len(data):
            offset, length, sha = spots[at]
            found[sha] = bytes(view[offset - start : offset - start + length])
            at += 1
    return found
