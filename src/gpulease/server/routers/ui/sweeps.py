"""The console's sweeps: the list, and a sweep's page with its trials and every trial's curve
of the chosen metric on one chart."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from fastapi import Query, Response

from gpulease.core.errors import GpuleaseError, NotFound
from gpulease.core.sweeps import params_text
from gpulease.schemas.sweeps import SweepPublic
from gpulease.server.routers.ui.guards import (
    ConsolePage,
    PageViewer,
    PartialViewer,
    console_router,
)
from gpulease.server.services import sweeps

router = console_router()

SWEEP_ID = re.compile(r"[0-9]{1,9}")  # fits the database's integer column
REFRESH_MS = 3000
MetricQuery = Annotated[str | None, Query(max_length=64)]


def _view(page: ConsolePage, ref: str, metric: str | None) -> SweepPublic:
    """A sweep of the viewer's; an unknown id, or someone else's, is NotFound."""
    if not SWEEP_ID.fullmatch(ref):
        raise NotFound(f"there is no sweep {ref[:40]!r}; sweep ids are numbers")
    sweep = sweeps.get_sweep(page.session, page.user, int(ref))
    return sweeps.view(page.session, sweep, page.runtime.catalog, metric or None)


def _context(view: SweepPublic, metric: str | None) -> dict[str, Any]:
    labels = {
        str(t.run_id): f"trial {t.index} ({params_text(t.params)})"
        for t in view.trials
        if t.run_id is not None
    }
    query = f"?key={view.metric}" if view.metric else ""
    return {
        "sweep": view,
        "chosen": metric or "",
        "labels": json.dumps(labels),
        "curves_url": f"/api/v1/sweeps/{view.id}/curves{query}",
        "live_src": f"/partials/sweeps/{view.id}" + (f"?metric={metric}" if metric else ""),
        "refresh_ms": REFRESH_MS,
        "params_text": params_text,
    }


@router.get("/sweeps")
def sweeps_page(page: PageViewer) -> Response:
    catalog = page.runtime.catalog
    found = [
        sweeps.view(page.session, s, catalog) for s in sweeps.list_sweeps(page.session, page.user)
    ]
    return page.render("sweeps/list.html", {"sweeps": found}, page="sweeps")


@router.get("/sweeps/{ref}")
def sweep_page(ref: str, page: PageViewer, metric: MetricQuery = None) -> Response:
    try:
        view = _view(page, ref, metric)
    except GpuleaseError as exc:
        return page.refused(
            exc, "Sweep not found" if isinstance(exc, NotFound) else "Cannot show it"
        )
    return page.render("sweeps/page.html", _context(view, metric), page="sweeps")


@router.get("/partials/sweeps/{ref}")
def sweep_live(ref: str, page: PartialViewer, metric: MetricQuery = None) -> Response:
    """The sweep page's summary and trials, re-rendered for live.js."""
    try:
        view = _view(page, ref, metric)
    except GpuleaseError as exc:
        return Response(exc.message, status_code=exc.status, media_type="text/plain")
    return page.render("sweeps/_trials.html", _context(view, metric))
