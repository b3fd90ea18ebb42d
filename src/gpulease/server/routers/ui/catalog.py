"""The console's GPU catalog: models, prices by plan, free/total GPUs, and template support."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Response
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog, share_text
from gpulease.core.money import format_credits
from gpulease.core.pricing import FULL_BP
from gpulease.server.orm import User
from gpulease.server.routers.ui.billing import windows_view
from gpulease.server.routers.ui.guards import PageViewer, console_router
from gpulease.server.services import nodes, templates
from gpulease.server.services.billing import offpeak
from gpulease.server.services.templates import TemplateView

router = console_router()


@dataclass(frozen=True)
class TemplateFit:
    """Whether a template can run on some node that has this model; reason when not."""

    template: str
    ok: bool
    reason: str


@dataclass(frozen=True)
class CatalogRow:
    name: str
    is_gpu: bool
    memory_gb: float
    hourly: str
    daily: str | None
    spot: str | None
    offpeak: str | None
    free: int
    total: int
    simulated: int
    fits: list[TemplateFit]
    share: str | None  # '12 vCPU, 60 GB RAM' per GPU (per instance for CPU); None: no node


def best_offpeak_bp(session: Session) -> int:
    """The best off-peak discount of the operator's windows, in basis points (0: none)."""
    return max((w.discount_bp for _, w in offpeak.list_windows(session)), default=0)


def usable_templates(session: Session, owner: User, catalog: Catalog) -> list[TemplateView]:
    """Built-in templates and the owner's own ready ones, each with where it can run."""
    return [
        v for v in templates.list_templates(session, owner, catalog) if v.status == templates.READY
    ]


def template_fits(session: Session, owner: User, catalog: Catalog) -> dict[str, list[TemplateFit]]:
    """Per catalog model, whether each template can run on a node with it, and why not
    (services/templates: the nodes' drivers against the templates' CUDA builds)."""
    fits: dict[str, list[TemplateFit]] = {m.name: [] for m in catalog.models}
    for view in usable_templates(session, owner, catalog):
        for a in view.availability:
            if a.model in fits:
                reason = a.reason or a.note or ""
                fits[a.model].append(TemplateFit(view.template.name, a.available, reason))
    return fits


def catalog_rows(session: Session, owner: User, catalog: Catalog) -> list[CatalogRow]:
    avail = nodes.availability(session, catalog)
    symbol = catalog.currency_symbol
    best_bp = best_offpeak_bp(session)
    fits = template_fits(session, owner, catalog)
    shares = nodes.shares_per_gpu(session, catalog)
    rows = []
    for m in catalog.models:
        a = avail[m.name]
        off = m.hourly_micro * (FULL_BP - best_bp) // FULL_BP if best_bp else None
        rows.append(
            CatalogRow(
                name=m.name,
                is_gpu=m.is_gpu,
                memory_gb=m.memory_gb,
                hourly=format_credits(m.hourly_micro, symbol),
                daily=format_credits(m.daily_micro, symbol) if m.daily_micro else None,
                spot=format_credits(m.spot_hourly_micro, symbol) if m.spot_hourly_micro else None,
                offpeak=format_credits(off, symbol) if off is not None else None,
                free=a.free,
                total=a.total,
                simulated=a.simulated,
                fits=fits.get(m.name, []),
                share=share_text(*shares[m.name]) if m.name in shares else None,
            )
        )
    return sorted(rows, key=lambda r: (not r.is_gpu, r.total == 0))


@router.get("/catalog")
def catalog_page(console: PageViewer) -> Response:
    rows = catalog_rows(console.session, console.user, console.runtime.catalog)
    context = {"rows": rows, "windows": windows_view(console.session)}
    return console.render("catalog/page.html", context, page="catalog")
