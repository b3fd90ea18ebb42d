"""Datasets: list, show, remove, and the push protocol; and the runner's dataset calls.

A push (docs/datasets.md): GET /datasets/NAME/current says the current version's manifest
digest (a client holding that tree is done); POST /datasets/NAME/pushes opens a push; PUT
.../files/PART sends a part of the file list (paths, sizes, chunk hashes) and answers with
the chunks the server lacks; POST .../chunks sends those, many per request, as a chunk pack
(gpulease.storage.chunking); POST .../commit makes the version. Runners fetch mounted
versions under /runner/v1/datasets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from gpulease.core.errors import InvalidInput
from gpulease.schemas import datasets as wire
from gpulease.schemas.runner import (
    RUNNER_API,
    RunnerChunkRequest,
    RunnerDatasets,
)
from gpulease.server.db import transaction
from gpulease.server.routers.deps import (
    CurrentUser,
    DetachedRunnerInstance,
    DetachedUser,
    IdPath,
    RunnerInstance,
    SessionDep,
    runtime,
)
from gpulease.server.routers.pieces import PiecesResponse
from gpulease.server.services.datasets import commits, library, mounts, quota, uploads
from gpulease.server.services.datasets.vault import Vault
from gpulease.storage import file_lists
from gpulease.storage.buffers import BufferPool
from gpulease.storage.chunking import PackError

router = APIRouter(tags=["datasets"])
runner_router = APIRouter(prefix=f"{RUNNER_API}/datasets", tags=["runner"])
PACK = "application/octet-stream"
MAX_FILES_BYTES = 64 * 1024 * 1024


def vault_of(request: Request) -> Vault:
    vault = runtime(request).vault
    assert vault is not None, "the runtime was built without dataset storage"
    return vault


def _quota(request: Request) -> int:
    return runtime(request).settings.storage_quota_bytes


@router.get("/datasets")
def list_datasets(session: SessionDep, user: CurrentUser, request: Request) -> wire.DatasetList:
    found = [wire.DatasetPublic.model_validate(d) for d in library.list_datasets(session, user)]
    used = quota.usage(session, user.id)
    return wire.DatasetList(
        datasets=found, usage=wire.StorageUsage(used_bytes=used, quota_bytes=_quota(request))
    )


@router.get("/datasets/{name}")
def show_dataset(name: str, session: SessionDep, user: CurrentUser) -> wire.DatasetDetail:
    dataset = library.get_dataset(session, user, name)
    return wire.DatasetDetail(
        dataset=wire.DatasetPublic.model_validate(dataset),
        versions=[
            wire.DatasetVersionPublic.model_validate(v) for v in library.versions(session, dataset)
        ],
        pushes=[
            wire.DatasetUploadPublic.model_validate(u)
            for u in library.recent_uploads(session, dataset)
        ],
        mounted_by=library.mounting_instances(session, dataset),
    )


@router.get("/datasets/{name}/current")
def current_dataset(name: str, session: SessionDep, user: CurrentUser) -> wire.DatasetCurrent:
    dataset, version = library.current_version(session, user, name)
    return wire.DatasetCurrent(
        dataset=wire.DatasetPublic.model_validate(dataset),
        manifest_sha256=uploads.digest_in_manifest_key(version.manifest_blob),
        changes_taken=True,
    )


@router.delete("/datasets/{name}")
def remove_dataset(name: str, user: DetachedUser, request: Request) -> wire.DatasetRemoved:
    freed = library.remove_dataset(runtime(request).sessions, vault_of(request), user, name)
    return wire.DatasetRemoved(name=name, freed_chunks=freed.chunks, freed_bytes=freed.bytes)


@router.post("/datasets/{name}/pushes", status_code=201)
def start_push(
    name: str, body: wire.DatasetUploadCreate, user: DetachedUser, request: Request
) -> wire.DatasetUploadPublic:
    if body.name != name:
        raise InvalidInput(f"the body names dataset {body.name!r} but the path {name!r}")
    upload = uploads.start_upload(
        runtime(request).sessions,
        vault_of(request),
        user,
        name,
        files=body.files,
        size=body.bytes,
        quota_bytes=_quota(request),
    )
    return wire.DatasetUploadPublic.model_validate(upload)


@router.get("/datasets/{name}/pushes/{push_id}")
def show_push(
    name: str, push_id: IdPath, session: SessionDep, user: CurrentUser
) -> wire.DatasetUploadPublic:
    return wire.DatasetUploadPublic.model_validate(uploads.get_upload(session, user, push_id))


@router.put(
    "/datasets/{name}/pushes/{push_id}/files/{part}",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": wire.DatasetFilesPart.model_json_schema()}},
        }
    },
)
async def push_files(
    name: str, push_id: IdPath, part: int, user: DetachedUser, request: Request
) -> wire.DatasetMissingChunks:
    """The body is a wire.DatasetFilesPart, parsed straight from its JSON bytes (thousands of
    files a request)."""
    raw = await read_capped(request, MAX_FILES_BYTES, "a file list part")
    rt, vault, quota_bytes = runtime(request), vault_of(request), _quota(request)

    def add() -> uploads.Missing:  # off the event loop: thousands of files to parse and check
        entries = _file_entries(raw)
        return uploads.add_files(
            rt.sessions, vault, user.id, push_id, part, entries, quota_bytes=quota_bytes
        )

    missing = await run_in_threadpool(add)
    return wire.DatasetMissingChunks(missing=missing.chunks, missing_bytes=missing.bytes)


def _file_entries(raw: bytes | bytearray) -> list[uploads.FileEntry]:
    try:
        body = wire.DatasetFilesPart.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(step) for step in first["loc"])
        raise InvalidInput(f"malformed file list: {where}: {first['msg']}") from None
    return [uploads.FileEntry(f.path, f.size, tuple(f.chunks)) for f in body.files]


async def read_capped(request: Request, limit: int, what: str) -> bytes | bytearray:
    """The request's body, at most limit bytes. A body that declares its length is read
    into one buffer of that size as it arrives: keeping the pieces and joining them at the
    end cost the server more than half again as much CPU as this copy (fresh memory for
    every piece, then for the 16 MB join)."""
    length = _declared_length(request, limit, what)
    if length is None:
        return await _read_undeclared(request, limit, what)
    body = bytearray(length)
    await _read_into(request, memoryview(body), what)
    return body


@asynccontextmanager
async def pack_body(request: Request, limit: int, what: str) -> AsyncIterator[memoryview]:
    """A chunk pack's body (at most limit bytes), viewed in a buffer kept for the next pack
    where it declares its length, as the CLI and the runner do: a 16 MiB body in fresh
    memory cost the server more than copying it in (storage/buffers.py). The view is valid
    inside the block only."""
    length = _declared_length(request, limit, what)
    if length is None:
        with memoryview(await _read_undeclared(request, limit, what)) as view:
            yield view
        return
    buffer = _PACK_BODIES.take(length)
    try:
        with memoryview(buffer) as whole:
            view = whole[:length]
            try:
                await _read_into(request, view, what)
                yield view
            finally:
                view.release()
    finally:
        _PACK_BODIES.give(buffer)  # kept only if no view of it is left


# Two kept: a push sends two packs at a time (16 MiB of chunks each), a runner's workspace
# save one (32 MiB); at most 80 MiB stay mapped.
_PACK_BODIES = BufferPool(keep=2, keep_bytes=40 << 20)


def _declared_length(request: Request, limit: int, what: str) -> int | None:
    declared = request.headers.get("content-length")
    if declared is None or not declared.isascii() or not declared.isdigit():
        return None
    length = int(declared)
    if length > limit:
        raise InvalidInput(_too_big(limit, what))
    return length


def _too_big(limit: int, what: str) -> str:
    return f"{what} may hold at most {limit} bytes; send smaller ones"


async def _read_undeclared(request: Request, limit: int, what: str) -> bytes:
    parts = []
    size = 0
    async for piece in request.stream():
        size += len(piece)
        if size > limit:
            raise InvalidInput(_too_big(limit, what))
        parts.append(piece)
    return b"".join(parts)


async def _read_into(request: Request, body: memoryview, what: str) -> None:
    """Fill body, exactly, from the request's stream."""
    length = len(body)
    at = 0
    async for piece in request.stream():
        end = at + len(piece)
        if end > length:  # the HTTP server ends such a request itself; never write past it
            raise InvalidInput(f"{what} is longer than its Content-Length of {length} bytes")
        body[at:end] = piece
        at = end
    if at != length:
        raise InvalidInput(f"{what} ended after {at} of its {length} bytes; send it again")


@router.post("/datasets/{name}/pushes/{push_id}/chunks")
async def push_chunks(
    name: str, push_id: IdPath, user: DetachedUser, request: Request
) -> wire.DatasetChunksReceived:
    try:
        async with pack_body(request, uploads.MAX_PACK_BYTES, "a chunk pack") as body:
            received = await run_in_threadpool(
                uploads.store_chunks,
                runtime(request).sessions,
                vault_of(request),
                user.id,
                push_id,
                body,
            )
    except PackError as exc:
        raise InvalidInput(f"malformed chunk pack: {exc}") from exc
    return wire.DatasetChunksReceived(
        chunks=received.chunks, bytes=received.bytes, new_chunks=received.new_chunks
    )


@router.post("/datasets/{name}/pushes/{push_id}/commit", status_code=201)
def commit_push(
    name: str, push_id: IdPath, body: wire.DatasetCommit, user: DetachedUser, request: Request
) -> wire.DatasetPublic:
    rt = runtime(request)
    version = commits.commit_upload(
        rt.sessions,
        vault_of(request),
        user.id,
        push_id,
        parts=body.parts,
        files=body.files,
        size=body.bytes,
        quota_bytes=_quota(request),
        base_version=body.base_version,
        removed=body.removed,
    )
    with transaction(rt.sessions) as session:  # the commit ran its own transactions
        return wire.DatasetPublic.model_validate(library.dataset_of(session, version))


@router.delete("/datasets/{name}/pushes/{push_id}", status_code=204)
def abandon_push(name: str, push_id: IdPath, user: DetachedUser, request: Request) -> Response:
    uploads.abandon_upload(runtime(request).sessions, vault_of(request), user, push_id)
    return Response(status_code=204)


# -- the runner protocol's dataset calls (docs/runner-protocol.md) -----------------------------


@runner_router.get("")
def runner_datasets(session: SessionDep, instance: RunnerInstance) -> RunnerDatasets:
    return RunnerDatasets(datasets=mounts.instance_mounts(session, instance.id))


@runner_router.get("/{dataset_id}/versions/{number}/manifest")
def runner_manifest(
    dataset_id: IdPath,
    number: IdPath,
    instance: DetachedRunnerInstance,
    request: Request,
    start: Annotated[int, Query(ge=0)] = 0,
) -> StreamingResponse:
    """The version's files from the start-th on and their chunks' keys, streamed as a file
    list (storage/file_lists.py) while the server reads it."""
    blocks = mounts.runner_file_list(
        runtime(request).sessions, vault_of(request), instance, dataset_id, number, start
    )
    return StreamingResponse(blocks, media_type=file_lists.MEDIA_TYPE)


@runner_router.post("/{dataset_id}/versions/{number}/chunks")
def runner_chunks(
    dataset_id: IdPath,
    number: IdPath,
    body: RunnerChunkRequest,
    instance: DetachedRunnerInstance,
    request: Request,
) -> Response:
    """A chunk pack of the sealed chunks asked for, in the order asked."""
    data = mounts.runner_chunks(
        runtime(request).sessions, vault_of(request), instance, dataset_id, number, body.chunks
    )
    return PiecesResponse(data, media_type=PACK)
