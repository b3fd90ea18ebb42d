"""A task's workdir: a gzip'd tar streamed to the server's uploads folder, then recorded on the
instance so that its runner unpacks it into the workspace before the first run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from gpulease.core.errors import InvalidInput
from gpulease.server.db import transaction
from gpulease.server.orm import User
from gpulease.server.services.instances import lifecycle

MAX_WORKDIR_BYTES = 512 * 1024 * 1024


def find_instance_id(sessions: sessionmaker[Session], owner: User, ref: str) -> int:
    """The id of owner's instance `ref`, looked up in a transaction that ends before the
    upload streams in."""
    with transaction(sessions) as session:
        return lifecycle.get_instance(session, owner, ref).id


async def receive(chunks: AsyncIterator[bytes], target: Path) -> None:
    """Write the upload to target (through a .partial file, so that a broken upload never
    replaces a whole one); refuse an empty one or one over MAX_WORKDIR_BYTES."""
    partial = target.with_suffix(".partial")
    size = 0
    with partial.open("wb") as out:
        async for chunk in chunks:
            size += len(chunk)
            if size > MAX_WORKDIR_BYTES:
                out.close()
                partial.unlink(missing_ok=True)
                raise InvalidInput(
                    "the workdir is larger than 512 MiB; push big data as a dataset instead"
                )
            out.write(chunk)
    if size == 0:
        partial.unlink(missing_ok=True)
        raise InvalidInput("the workdir upload is empty; send a gzip'd tar of the directory")
    partial.replace(target)


def record(sessions: sessionmaker[Session], owner: User, ref: str, upload: Path) -> None:
    """Point the instance at its uploaded workdir; one that was waiting for it may start."""
    with transaction(sessions) as session:
        instance = lifecycle.get_instance(session, owner, ref)
        instance.workdir_upload = str(upload)
        if instance.awaiting_workdir:
            instance.awaiting_workdir = False
            instance.status_message = ""
