"""The dashboard: balance, instances, recent runs, notifications and a live log tail."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog
from gpulease.core.errors import NotFound
from gpulease.core.money import format_credits, ncu
from gpulease.schemas.accounts import UserPublic
from gpulease.schemas.instances import InstancePublic
from gpulease.schemas.notifications import NotificationPublic
from gpulease.schemas.runs import RunPublic
from gpulease.server.orm import User
from gpulease.server.routers.api.presenters import instance_public
from gpulease.server.routers.deps import SESSION_COOKIE, runtime, tx
from gpulease.server.routers.ui.guards import clear_session_cookie, login_url, viewer
from gpulease.server.routers.ui.templating import render, span
from gpulease.server.services import console, ledger, notifications, runs
from gpulease.server.services.instances import lifecycle
from gpulease.server.services.instances.states import QUEUED, RUNNING

router = APIRouter()

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


def _to_login(request: Request) -> Response:
    response = RedirectResponse(login_url(request), status_code=303)
    if SESSION_COOKIE in request.cookies:
        clear_session_cookie(request, response)
    return response


def _run_not_found(request: Request, user: UserPublic, message: str) -> Response:
    context = {"title": "Run not found", "message": message}
    return render(request, "errors/error.html", context, user=user, status_code=404)


@router.get("/")
def dashboard(request: Request, run: Annotated[str | None, Query()] = None) -> Response:
    catalog = runtime(request).catalog
    with tx(request) as session:
        user = viewer(session, request)
        if user is None:
            return _to_login(request)
        public = UserPublic.model_validate(user)
        try:
            if run is not None and not RUN_ID.fullmatch(run):
                raise NotFound(f"there is no run {run!r}; run ids are numbers")
            view = load_dashboard(session, user, catalog, int(run) if run else None)
        except NotFound as exc:
            return _run_not_found(request, public, exc.message)
    context = {"view": view, "refresh_ms": REFRESH_MS}
    return render(request, "dashboard/page.html", context, user=public, page="dashboard")


@router.get("/partials/dashboard")
def dashboard_live(request: Request) -> Response:
    """The dashboard's live parts, re-rendered; the page swaps them in by element id."""
    catalog = runtime(request).catalog
    with tx(request) as session:
        user = viewer(session, request)
        if user is None:
            return Response("log in again", status_code=401, media_type="text/plain")
        public = UserPublic.model_validate(user)
        view = load_dashboard(session, user, catalog)
    return render(request, "dashboard/live.html", {"view": view}, user=public)
