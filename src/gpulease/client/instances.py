"""Instances: rent, list, stop, start, resize, release; their workdir and GPUs."""

from __future__ import annotations

from pathlib import Path

from gpulease.client.base import InstanceRef, Resource, path_part
from gpulease.client.workdir import WorkdirArchive, pack_workdir
from gpulease.schemas.instances import InstanceCreate, InstancePublic, InstanceStart, ResizeRequest
from gpulease.schemas.metrics import InstanceGpus


class InstancesAPI(Resource):
    """`client.instances`: your instances, by id or name."""

    def create(self, body: InstanceCreate) -> InstancePublic:
        """Rent `body.gpu` ("A100-80GB:4"; None for CPU only). It starts queued; poll its
        status. awaiting_workdir: an upload_workdir() follows, and the server holds the
        instance in the queue until it has the files."""
        return self._api.one(InstancePublic, "POST", "/instances", body=body)

    def list(self, *, include_released: bool = False) -> list[InstancePublic]:
        params = {"all": "true"} if include_released else None
        return self._api.many(InstancePublic, "/instances", params=params)

    def get(self, ref: InstanceRef) -> InstancePublic:
        return self._api.one(InstancePublic, "GET", f"/instances/{path_part(ref)}")

    def stop(self, ref: InstanceRef) -> InstancePublic:
        """Ask for a stop: billing ends once the runner has stopped; the workspace stays."""
        return self._api.one(InstancePublic, "POST", f"/instances/{path_part(ref)}/stop")

    def start(self, ref: InstanceRef, body: InstanceStart | None = None) -> InstancePublic:
        """Queue a stopped instance again; InstanceStart(no_gpu=True): CPU only at the CPU
        price, for setup and data work (a later plain start brings its GPUs back)."""
        path = f"/instances/{path_part(ref)}/start"
        return self._api.one(InstancePublic, "POST", path, body=body)

    def resize(self, ref: InstanceRef, body: ResizeRequest) -> InstancePublic:
        """Give a stopped instance another GPU model and/or count, or none (no_gpu); its
        workspace is kept and its price follows the catalog."""
        path = f"/instances/{path_part(ref)}/resize"
        return self._api.one(InstancePublic, "POST", path, body=body)

    def release(self, ref: InstanceRef) -> InstancePublic:
        """Give the instance up for good: it stops and its workspace is deleted."""
        return self._api.one(InstancePublic, "POST", f"/instances/{path_part(ref)}/release")

    def upload_workdir(self, ref: InstanceRef, source: Path | WorkdirArchive) -> int:
        """Upload a directory (packed here, see pack_workdir) or an already packed archive
        as the instance's workdir; returns the bytes sent."""
        archive = source if isinstance(source, WorkdirArchive) else pack_workdir(source)
        try:
            self._api.send(
                "PUT",
                f"/instances/{path_part(ref)}/workdir",
                content=archive.chunks(),
                headers={"Content-Type": "application/gzip", "Content-Length": str(archive.size)},
            )
        finally:
            if archive is not source:
                archive.close()
        return archive.size

    def gpus(self, ref: InstanceRef, *, minutes: int = 15, max_points: int = 300) -> InstanceGpus:
        """The instance's GPUs: newest sample and recent readings (simulated ones flagged)."""
        params = {"minutes": minutes, "max_points": max_points}
        path = f"/instances/{path_part(ref)}/gpus"
        return self._api.one(InstanceGpus, "GET", path, params=params)
