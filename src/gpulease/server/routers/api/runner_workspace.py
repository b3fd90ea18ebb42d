"""The runner's workspace calls: save a workspace at stop, restore it on the node it moved to.

Saving (docs/runner-protocol.md): POST /runner/v1/workspace/missing with the chunk ids of
every file answers with the chunks the server lacks, POST .../chunks sends those as a chunk
pack (gpulease.storage.chunking), PUT .../snapshot makes the file list the instance's
snapshot (a save that finds the files of the last snapshot posts .../unchanged instead). A
stopping runner whose jobs ended first posts .../saving: billing ends then, and
its save is bounded by its own limit instead of the stop grace. Restoring: GET .../snapshot,
then POST .../chunks/fetch for the chunks the node lacks. Each call reaches only the
calling runner's own instance (services/workspaces.py).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from gpulease.core.errors import InvalidInput
from gpulease.schemas.runner import (
    RUNNER_API,
    RunnerChunkRequest,
    RunnerWorkspaceChunks,
    RunnerWorkspaceFile,
    RunnerWorkspaceMissing,
    RunnerWorkspaceSaved,
    RunnerWorkspaceSnapshot,
)
from gpulease.server.routers.api.clock import Now
from gpulease.server.routers.api.datasets import PACK, pack_body, vault_of
from gpulease.server.routers.deps import DetachedRunnerInstance, RunnerInstance, SessionDep, runtime
from gpulease.server.routers.pieces import PiecesResponse
from gpulease.server.services import workspaces
from gpulease.storage.chunking import PackError

router = APIRouter(prefix=f"{RUNNER_API}/workspace", tags=["runner"])


@router.post("/missing")
def missing(
    body: RunnerWorkspaceChunks, session: SessionDep, instance: RunnerInstance
) -> RunnerWorkspaceMissing:
    return RunnerWorkspaceMissing(
        missing=workspaces.missing_chunks(session, instance.id, body.chunks)
    )


@router.post("/saving", status_code=204)
def saving(session: SessionDep, instance: RunnerInstance, now: Now) -> Response:
    workspaces.saving_started(session, instance, now)
    return Response(status_code=204)


@router.post("/chunks", status_code=204)
async def store(instance: DetachedRunnerInstance, request: Request) -> Response:
    try:
        async with pack_body(request, workspaces.MAX_PACK_BYTES, "a chunk pack") as body:
            await run_in_threadpool(
                workspaces.store_chunks,
                runtime(request).sessions,
                vault_of(request),
                instance.id,
                body,
            )
    except PackError as exc:
        raise InvalidInput(f"malformed chunk pack: {exc}") from exc
    return Response(status_code=204)


@router.post("/unchanged", status_code=204)
def unchanged(
    body: RunnerWorkspaceSaved, session: SessionDep, instance: RunnerInstance, now: Now
) -> Response:
    workspaces.confirm_snapshot(session, instance, body.snapshot, now)
    return Response(status_code=204)


@router.put("/snapshot")
def save(
    body: RunnerWorkspaceSnapshot, instance: DetachedRunnerInstance, request: Request
) -> RunnerWorkspaceSaved:
    files = [
        workspaces.SnapshotFile(f.path, f.size, f.mode, f.mtime, tuple(f.chunks))
        for f in body.files
    ]
    saved = workspaces.save_snapshot(
        runtime(request).sessions, vault_of(request), instance.id, files, body.dirs
    )
    return RunnerWorkspaceSaved(snapshot=saved.snapshot)


@router.get("/snapshot", response_model=None)
def snapshot(
    instance: DetachedRunnerInstance, request: Request
) -> RunnerWorkspaceSnapshot | Response:
    """The instance's last snapshot; 204 when its runner never saved one."""
    found = workspaces.read_snapshot(runtime(request).sessions, vault_of(request), instance.id)
    if found is None:
        return Response(status_code=204)
    return RunnerWorkspaceSnapshot(
        files=[
            RunnerWorkspaceFile(
                path=f.path, size=f.size, mode=f.mode, mtime=f.mtime, chunks=list(f.chunks)
            )
            for f in found.files
        ],
        dirs=list(found.dirs),
    )


@router.post("/chunks/fetch")
def fetch(body: RunnerChunkRequest, instance: DetachedRunnerInstance, request: Request) -> Response:
    """A chunk pack of the plaintext chunks asked for, in the order asked."""
    data = workspaces.fetch_chunks(
        runtime(request).sessions, vault_of(request), instance.id, body.chunks
    )
    return PiecesResponse(data, media_type=PACK)
