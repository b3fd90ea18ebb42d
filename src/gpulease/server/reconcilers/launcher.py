"""Start runners for placed instances, stop them for stopping ones, release what was asked."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Select, func, or_, select, update
from sqlalchemy.orm import Session

from gpulease.backends.base import RunnerSpec
from gpulease.core.errors import InvalidInput
from gpulease.server import runner_socket
from gpulease.server.db import finds_any, readers, transaction, utcnow
from gpulease.server.orm import Gpu, Instance
from gpulease.server.runtime import Runtime
from gpulease.server.security import RUNNER_TOKEN_PREFIX, hash_token, new_token
from gpulease.server.services import notifications, templates, workspaces
from gpulease.server.services.instances import gangs
from gpulease.server.services.instances.lifecycle import finish_release
from gpulease.server.services.instances.states import (
    FAILED,
    RELEASED,
    STARTING,
    STOPPED,
    STOPPING,
    switch_status,
)
from gpulease.server.tls import runner_trust

log = logging.getLogger("gpulease.launcher")


# What each step of the tick looks for. The tick asks for all of them in one query: on a
# quiet server (most ticks, every second) that is its only statement, where each step
# asked in a transaction of its own.
_PLACED = (Instance.status == STARTING, Instance.runner_launched_at.is_(None))
_STOPPING = (Instance.status == STOPPING,)
_RELEASABLE = (Instance.desired_state == "released", Instance.status.in_((STOPPED, FAILED)))
_RELEASED_ELSEWHERE = (
    Instance.status == RELEASED,
    or_(Instance.last_node_id.is_not(None), Instance.workspace_snapshot.is_not(None)),
)


def tick(rt: Runtime) -> None:
    steps: list[tuple[Callable[[Runtime], None], Select[Any]]] = [
        (launch_placed, select(Instance.id).where(*_PLACED)),
        (stop_broken_gangs, gangs.live_member_ids()),
        (finish_stops, select(Instance.id).where(*_STOPPING)),
        (finish_releases, select(Instance.id).where(*_RELEASABLE)),
        (forget_released_workspaces, select(Instance.id).where(*_RELEASED_ELSEWHERE)),
    ]
    with transaction(readers(rt.sessions)) as session:
        due = list(session.execute(select(*(looks.exists() for _, looks in steps))).one())
    if True not in due:
        return
    # From the first step with work on, each runs as before: a step can make work for the
    # next (a stop finished, then the release that waited for it).
    for step, _ in steps[due.index(True) :]:
        step(rt)


def stop_broken_gangs(rt: Runtime) -> None:
    """The other ranks of a multi-node run one of whose ranks failed or was stopped."""
    if not finds_any(rt.sessions, gangs.live_member_ids()):  # the usual case: no write lock
        return
    with transaction(rt.sessions) as session:
        gangs.stop_broken(session)


def launch_placed(rt: Runtime) -> None:
    with transaction(readers(rt.sessions)) as session:  # each launch claims its own
        ids = list(session.scalars(select(Instance.id).where(*_PLACED)))
    for instance_id in ids:
        _launch(rt, instance_id)


def _launch(rt: Runtime, instance_id: int) -> None:
    # The launch secret: it works until the runner opens its session (runner/connection.py).
    token = new_token(RUNNER_TOKEN_PREFIX)
    server_socket = _runner_socket(rt)
    now = utcnow()
    with transaction(rt.sessions) as session:
        claimed = session.execute(
            update(Instance)
            .where(
                Instance.id == instance_id,
                Instance.status == STARTING,
                Instance.runner_launched_at.is_(None),
            )
            .values(
                runner_launched_at=now,
                runner_token_hash=hash_token(token),
                last_heartbeat_at=now,
                status_message="starting runner",
            )
            .execution_options(synchronize_session=False)
        ).rowcount  # type: ignore[attr-defined]
        if claimed != 1:
            return  # someone else launched it
        instance = session.get(Instance, instance_id)
        assert instance is not None and instance.workspace is not None
        restore = _moved(session, rt, instance, now)
        instance.last_node_id = instance.node_id
        gpus = list(
            session.scalars(select(Gpu).where(Gpu.instance_id == instance_id).order_by(Gpu.index))
        )
        spec = RunnerSpec(
            instance_id=instance_id,
            server_url=rt.settings.runner_url,
            token=token,
            workspace=Path(instance.workspace),
            run_dir=rt.settings.runners_path / str(instance_id),
            env_cache=rt.settings.envs_path,
            template=templates.resolve(session, instance.owner_id, instance.template),
            gpu_indices=tuple(g.index for g in gpus if not g.simulated),
            gpu_uuids=tuple(g.uuid for g in gpus),
            heartbeat_interval_s=rt.settings.heartbeat_interval_s,
            sandbox=not rt.settings.unsandboxed_single_user,
            sandbox_uid=rt.settings.sandbox_uid_base + instance_id,
            server_certificate=runner_trust(rt.settings),
            dataset_cache=rt.settings.dataset_cache_path,
            server_socket=server_socket,
            node=instance.node.name if instance.node is not None else None,
            extra_env=gangs.rank_env(session, instance),
            fabric=gangs.fabric_link(session, instance, rt.settings),
            # on a fleet the workspace lives on the node: saved at stop, restored after a move
            workspace_save=not rt.backend.same_host,
            workspace_restore=restore,
            workspace_save_interval_s=rt.settings.workspace_save_interval_s,
            **_share(session, rt, instance),
        )
    try:
        handle = rt.backend.start(spec)
    except Exception as exc:  # a backend error must fail this instance, not the loop
        log.exception("could not start a runner for instance %s", instance_id)
        with transaction(rt.sessions) as session:
            instance = session.get(Instance, instance_id)
            if instance is not None and instance.status == STARTING:
                switch_status(session, instance, FAILED, f"could not start its runner: {exc}")
                notifications.notify(
                    session,
                    instance.owner_id,
                    "instance_failed",
                    f"instance {instance.name} failed: could not start its runner: {exc}",
                )
        return
    with transaction(rt.sessions) as session:
        session.execute(
            update(Instance)
            .where(Instance.id == instance_id)
            .values(runner_handle=handle)
            .execution_options(synchronize_session=False)
        )


def _moved(session: Session, rt: Runtime, instance: Instance, now: datetime) -> bool:
    """Whether the instance starts on another node than the one it last ran on; if so the
    user is told why (and how old the workspace's copy is, as of now), and on a fleet its
    runner restores the workspace's snapshot."""
    last, node = instance.last_node, instance.node
    if last is None or node is None or last.id == node.id:
        return False
    why = "left the cluster" if last.status == "gone" else "is full"
    message = f"moved from {last.name} to {node.name}: node {last.name} {why}"
    if rt.backend.same_host:
        pass  # one host: the workspace is where it was
    elif instance.workspace_snapshot_at is not None:
        message += "; " + workspaces.copy_age(instance.workspace_snapshot_at, now)
    else:
        message += "; no copy of its workspace was saved, so it starts with an empty one"
    instance.status_message = message[:500]
    notifications.notify(
        session, instance.owner_id, "instance_moved", f"instance {instance.name} {message}"
    )
    return not rt.backend.same_host


def _share(session: Session, rt: Runtime, instance: Instance) -> dict[str, Any]:
    """RunnerSpec's vcpus, memory_bytes and node_gpus: the instance's CPU and memory share
    (runner/cgroups.py), per GPU from the pricing file, else its node's cores and memory
    over the node's GPUs; a CPU-only instance the pricing file's CPU size."""
    node = instance.node
    counted = select(func.count()).select_from(Gpu).where(Gpu.present.is_(True))
    if node is not None:
        counted = counted.where(Gpu.node_id == node.id)
    node_gpus = session.scalar(counted) or 0
    try:
        model = rt.catalog.get(instance.gpu_model)
    except InvalidInput:
        return {"node_gpus": node_gpus}
    cpus = node.cpu_count if node is not None and node.cpu_count else os.cpu_count() or 1
    memory_mb = node.memory_mb if node is not None and node.memory_mb else 0
    if not memory_mb:
        memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    vcpus, ram_gb = model.share_per_gpu(cpus, memory_mb, node_gpus)
    count = max(1, instance.gpu_count) if model.is_gpu else 1
    return {
        "vcpus": vcpus * count,
        "memory_bytes": int(ram_gb * count * 2**30),
        "node_gpus": node_gpus,
    }


def _runner_socket(rt: Runtime) -> Path | None:
    """The server's Unix socket for a runner on this host while the server listens on it."""
    if not rt.backend.same_host:
        return None
    path = runner_socket.socket_path(rt.settings)
    return path if runner_socket.listening(path) else None


def finish_stops(rt: Runtime, now: datetime | None = None) -> None:
    """Stopping instances whose runner is gone, never started, or overran its grace (as of
    now, by default the real time)."""
    grace = timedelta(seconds=rt.settings.stop_grace_s)
    save_max = timedelta(seconds=rt.settings.workspace_save_max_s)
    now = now or utcnow()
    with transaction(readers(rt.sessions)) as session:  # _stopped checks the status again
        rows = [
            (
                i.id,
                i.runner_handle,
                i.runner_launched_at,
                i.stop_requested_at,
                i.preempted_at,
                i.workspace_saving_since,
            )
            for i in session.scalars(select(Instance).where(*_STOPPING))
        ]
    for instance_id, handle, launched_at, requested_at, preempted_at, saving in rows:
        if saving is not None and handle is not None:  # its jobs ended: billing ended then
            if not rt.backend.alive(handle):
                _stopped(rt, instance_id, "its runner has exited")
            elif now - saving > save_max:
                rt.backend.stop(handle, force=True)
                _stopped(
                    rt,
                    instance_id,
                    f"its runner did not save its workspace within "
                    f"{save_max.total_seconds():.0f} s and was killed; the copy saved before "
                    "stays",
                )
            continue
        if preempted_at is not None:  # its job's checkpoint grace comes first
            requested_at = requested_at and requested_at + timedelta(
                seconds=rt.settings.preempt_grace_s
            )
        reason = None
        if handle is None:
            if launched_at is None or now - launched_at > grace:
                reason = "stopped before its runner started"
        elif not rt.backend.alive(handle):
            reason = "its runner has exited"
        elif requested_at is not None and now - requested_at > grace:
            rt.backend.stop(handle, force=True)
            reason = f"its runner did not stop within {grace.seconds} s and was killed"
        if reason is None:
            continue
        _stopped(rt, instance_id, reason)


def _stopped(rt: Runtime, instance_id: int, reason: str) -> None:
    with transaction(rt.sessions) as session:
        instance = session.get(Instance, instance_id)
        if instance is not None and instance.status == STOPPING:
            switch_status(session, instance, STOPPED, instance.status_reason or reason)


def forget_released_workspaces(rt: Runtime) -> None:
    """Released instances whose workspace may still be elsewhere than the server's disk:
    its snapshot in the blob store is deleted (with its key), and its node is asked to
    delete the node's copy (a node that is gone keeps it until its operator cleans up)."""
    with transaction(readers(rt.sessions)) as session:
        rows = [
            (i.id, i.last_node.name if i.last_node is not None else None, i.workspace)
            for i in session.scalars(select(Instance).where(*_RELEASED_ELSEWHERE))
        ]
    for instance_id, node, workspace in rows:
        if node is not None and workspace and not rt.backend.same_host:
            rt.backend.delete_workspace(node, Path(workspace).name)
        if rt.vault is not None:
            workspaces.forget(rt.sessions, rt.vault, instance_id)
        with transaction(rt.sessions) as session:
            session.execute(
                update(Instance)
                .where(Instance.id == instance_id, Instance.status == RELEASED)
                .values(last_node_id=None)
                .execution_options(synchronize_session=False)
            )


def finish_releases(rt: Runtime) -> None:
    releasable = select(Instance).where(*_RELEASABLE)
    if not finds_any(rt.sessions, releasable.with_only_columns(Instance.id)):
        return
    with transaction(rt.sessions) as session:
        for instance in session.scalars(releasable):
            finish_release(session, instance)
            notifications.notify(
                session,
                instance.owner_id,
                "instance_released",
                f"instance {instance.name} released",
            )
