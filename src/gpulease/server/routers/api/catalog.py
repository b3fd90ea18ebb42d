"""The GPU catalog and nodes (templates: routers/api/templates.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gpulease.core.money import format_credits, ncu
from gpulease.core.records import from_attributes
from gpulease.schemas.catalog import GpuModelPublic, NodePublic
from gpulease.server.routers.deps import AdminUser, CurrentUser, SessionDep, runtime
from gpulease.server.services import nodes

router = APIRouter(tags=["catalog"])


@router.get("/gpus")
def list_gpu_models(session: SessionDep, _: CurrentUser, request: Request) -> list[GpuModelPublic]:
    catalog = runtime(request).catalog
    avail = nodes.availability(session, catalog)
    shares = nodes.shares_per_gpu(session, catalog)
    return [
        from_attributes(
            GpuModelPublic,
            m,
            ncu_factor=str(m.ncu_factor),
            hourly=format_credits(m.hourly_micro, catalog.currency_symbol),
            hourly_ncu=f"{ncu(m.hourly_micro, catalog.ncu_reference_hourly_micro):.6f}",
            daily=format_credits(m.daily_micro, catalog.currency_symbol),
            free=avail[m.name].free,
            total=avail[m.name].total,
            simulated=avail[m.name].simulated,
            vcpus_per_gpu=shares[m.name][0] if m.name in shares else None,
            ram_gb_per_gpu=shares[m.name][1] if m.name in shares else None,
        )
        for m in catalog.models
    ]


@router.get("/nodes")
def list_nodes(session: SessionDep, _: AdminUser) -> list[NodePublic]:
    return [NodePublic.model_validate(n) for n in nodes.list_nodes(session)]
