"""GPU quotas, set by admins; the scheduler enforces them (services/quotas.py)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter

from gpulease.schemas.quotas import QuotaPublic, QuotaUpdate
from gpulease.server.routers.deps import AdminUser, SessionDep
from gpulease.server.services import quotas

router = APIRouter(tags=["admin"])


@router.get("/admin/quotas")
def list_quotas(session: SessionDep, admin: AdminUser) -> list[QuotaPublic]:
    return [
        QuotaPublic(kind="user" if kind == "user" else "team", name=name, max_gpus=n)
        for kind, name, n in quotas.list_quotas(session)
    ]


@router.put("/admin/quotas/{kind}/{name}")
def set_quota(
    kind: Literal["users", "teams"],
    name: str,
    body: QuotaUpdate,
    session: SessionDep,
    admin: AdminUser,
) -> QuotaPublic:
    """Set (or with null lift) the GPU cap of user or team `name`."""
    row = quotas.set_quota(session, kind.removesuffix("s"), name, body.max_gpus)
    return QuotaPublic(
        kind="user" if kind == "users" else "team", name=row.name, max_gpus=row.max_gpus
    )
