"""Opening an instance as one request asks for it: the instance, its datasets, its autostop."""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog
from gpulease.schemas.instances import InstanceCreate
from gpulease.server.orm import Instance, User
from gpulease.server.services.datasets import mounts
from gpulease.server.services.instances import autostop, lifecycle
from gpulease.server.settings import Settings


def open_instance(
    session: Session, owner: User, spec: InstanceCreate, *, catalog: Catalog, settings: Settings
) -> Instance:
    """Create owner's instance from spec with its datasets mounted and its automatic-stop
    rules set, all or nothing (the caller's transaction rolls back any refusal)."""
    instance = lifecycle.create_instance(
        session,
        owner,
        catalog=catalog,
        gpu=spec.gpu,
        template=spec.template,
        name=spec.name,
        auto_release=spec.auto_release,
        awaiting_workdir=spec.awaiting_workdir,
        plan=spec.plan,
        team=spec.team,
        start_when_cheap=spec.start_when_cheap,
        auto_renew=spec.auto_renew,
        min_start_minutes=settings.min_start_minutes,
        workspaces=settings.workspaces_path,
    )
    if spec.datasets:
        mounts.attach_datasets(session, owner, instance, spec.datasets)
    if any(
        v is not None for v in (spec.idle_util_pct, spec.idle_minutes, spec.max_runtime_minutes)
    ):
        autostop.set_autostop(
            session,
            instance,
            idle_util=spec.idle_util_pct,
            idle_minutes=spec.idle_minutes,
            max_runtime_minutes=spec.max_runtime_minutes,
            stop_after_run=None,
            ceiling=settings.idle_stop_max_minutes,
        )
    return instance
