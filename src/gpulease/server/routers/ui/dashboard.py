"""The dashboard: balance, instances, recent runs, notifications and a live log tail."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from fastapi import Query, Response
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog
from gpulease.core.errors import NotFound
from gpulease.core.money import format_credits, ncu
from gpulease.schemas.instances import InstancePublic
from gpulease.schemas.notifications import NotificationPublic
from gpulease.schemas.runs import RunPublic
from gpulease.server.orm import User
from gpulease.server.routers.api.presenters import instance_public
from gpulease.server.routers.ui.guards import PageViewer, PartialViewer, console_router
from gpulease.server.routers.ui.templating import span
from gpulease.server.services import console, ledger, notifications, runs
from gpulease.server.services.instances import lifecycle
from gpulease.server.services.instances.states import QUEUED, RUNNING

router = console_router()

RECENT_RUNS = 10
RECENT_NOTIFICATIONS = 8
# The log tail starts this many chunks before the end of a run's output.
TAIL_CHUNKS = 500
# How often the page refreshes its live parts, in milliseconds.
REFRESH_MS = 2000
RUN_ID = re.compile(r"[0-9]{1,9}")  # fits the database's integer column


@dataclass(frozen=True)
class RunRow:
    run: RunPublic
    instance_name: str
    tail_from: int
    """The `after` for the log stream: the last TAIL_CHUNKS chunks, not the whole log."""


@dataclass(frozen=True)
class DashboardView:
    balance: str
    balance_ncu: str
    spend_hourly: str
    runway: str | None
    instances: list[InstancePublic]
    running: int
    queued: int
    runs: list[RunRow]
    notifications: list[NotificationPublic]
    log_run: RunRow | None
    log_pinned: bool


def _run_rows(session: Session, user: User, found: list[RunPublic]) -> list[RunRow]:
    names = console.instance_names(session, user, {r.instance_id for r in found})
    last = console.last_log_seqs(session, [r.id for r in found])
    return [
        RunRow(
            run=r,
            instance_name=names.get(r.instance_id, f"#{r.instance_id}"),
            tail_from=max(last.get(r.id, -1) - TAIL_CHUNKS, -1),
        )
        for r in found
    ]


def load_dashboard(
    session: Session, user: User, catalog: Catalog, selected_run: int | None = None
) -> DashboardView:
    """Everything the dashboard shows. A selected run that is not the user's is NotFound."""
    symbol = catalog.currency_symbol
    micro = ledger.balance(session, user.id)
    positions = lifecycle.queue_position_map(session)
    instances = [
        instance_public(session, i, catalog, positions)
        for i in lifecycle.list_instances(session, user)
    ]
    billed = [i for i in instances if i.status == RUNNING]
    spend = sum(i.hourly_micro for i in billed)
    recent = [RunPublic.model_validate(r) for r in runs.list_runs(session, user, limit=RECENT_RUNS)]
    rows = _run_rows(session, user, recent)
    log_run = rows[0] if rows else None
    if selected_run is not None:
        chosen = [row for row in rows if row.run.id == selected_run]
        if not chosen:
            run = RunPublic.model_validate(runs.get_run(session, user, selected_run))
            chosen = _run_rows(session, user, [run])
        log_run = chosen[0]
    return DashboardView(
        balance=format_credits(micro, symbol),
        balance_ncu=f"{ncu(micro, catalog.ncu_reference_hourly_micro):.4f}",
        spend_hourly=format_credits(spend, symbol),
        runway=span(max(micro, 0) * 3600 // spend) if spend else None,
        instances=instances,
        running=len(billed),
        queued=sum(1 for i in instances if i.status == QUEUED),
        runs=rows,
        notifications=[
            NotificationPublic.model_validate(n)
            for n in notifications.recent(session, user.id, limit=RECENT_NOTIFICATIONS)
        ],
        log_run=log_run,
        log_pinned=selected_run is not None,
    )


@router.get("/")
def dashboard(console: PageViewer, run: Annotated[str | None, Query()] = None) -> Response:
    try:
        if run is not None and not RUN_ID.fullmatch(run):
            raise NotFound(f"there is no run {run!r}; run ids are numbers")
        selected = int(run) if run else None
        view = load_dashboard(console.session, console.user, console.runtime.catalog, selected)
    except NotFound as exc:
        return console.refused(exc, "Run not found")
    context = {"view": view, "refresh_ms": REFRESH_MS}
    return console.render("dashboard/page.html", context, page="dashboard")


@router.get("/partials/dashboard")
def dashboard_live(console: PartialViewer) -> Response:
    """The dashboard's live parts, re-rendered; the page swaps them in by element id."""
    view = load_dashboard(console.session, console.user, console.runtime.catalog)
    return console.render("dashboard/live.html", {"view": view})
