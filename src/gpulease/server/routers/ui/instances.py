"""The console's instance page: live status, stop/start/release, its runs, GPU charts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Form, Request, Response
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog
from gpulease.core.errors import GpuleaseError, NotFound
from gpulease.schemas.accounts import UserPublic
from gpulease.schemas.instances import InstancePublic
from gpulease.schemas.runs import RunPublic
from gpulease.server.orm import Instance, User
from gpulease.server.routers.api.presenters import instance_public
from gpulease.server.routers.deps import runtime, same_origin, tx
from gpulease.server.routers.ui.account import cross_site_refusal
from gpulease.server.routers.ui.guards import login_url, viewer
from gpulease.server.routers.ui.templating import render
from gpulease.server.services import runs
from gpulease.server.services.instances import lifecycle
from gpulease.server.services.instances.states import (
    FAILED,
    QUEUED,
    RELEASED,
    RUNNING,
    STARTING,
    STOPPED,
)

router = APIRouter()

FormText = Annotated[str, Form()]
INSTANCE_RUNS = 50
REFRESH_MS = 2000
MAX_REF = 64


@dataclass(frozen=True)
class GpuCard:
    index: int
    uuid: str
    model: str
    memory_mb: int
    simulated: bool


@dataclass(frozen=True)
class InstanceView:
    instance: InstancePublic
    runs: list[RunPublic]
    gpus: list[GpuCard]
    can_stop: bool
    can_start: bool
    can_release: bool
    can_run: bool


def load_instance(
    session: Session, user: User, catalog: Catalog, ref: str
) -> tuple[Instance, InstanceView]:
    """The instance page's content; someone else's instance is NotFound, as is a bad ref."""
    if not ref or len(ref) > MAX_REF:
        raise NotFound(f"you have no instance {ref[:MAX_REF]!r}; see the dashboard")
    instance = lifecycle.get_instance(session, user, ref)
    positions = lifecycle.queue_position_map(session)
    public = instance_public(session, instance, catalog, positions)
    found = runs.list_runs(session, user, instance.id, limit=INSTANCE_RUNS)
    status = instance.status
    view = InstanceView(
        instance=public,
        runs=[RunPublic.model_validate(r) for r in found],
        gpus=[
            GpuCard(g.index, g.uuid, g.model or g.nvml_name, g.memory_mb, g.simulated)
            for g in instance.gpus
        ],
        can_stop=status in (QUEUED, STARTING, RUNNING),
        can_start=status in (STOPPED, FAILED),
        can_release=status != RELEASED and instance.desired_state != "released",
        can_run=status in (QUEUED, STARTING, RUNNING) and instance.desired_state == "running",
    )
    return instance, view


def _page(
    request: Request,
    session: Session,
    user: User,
    ref: str,
    *,
    error: str = "",
    command: str = "",
    status_code: int = 200,
) -> Response:
    """Rendered inside the transaction: the partials of other areas get the ORM rows."""
    public_user = UserPublic.model_validate(user)
    try:
        instance, view = load_instance(session, user, runtime(request).catalog, ref)
    except NotFound as exc:
        missing = {"title": "Instance not found", "message": exc.message}
        return render(request, "errors/error.html", missing, user=public_user, status_code=404)
    context = {
        "view": view,
        # What other areas' partials get (see the contracts): the ORM rows, and `csrf`, empty
        # because console forms are guarded by their Origin (routers/deps.same_origin).
        "instance": instance,
        "user": user,
        "csrf": "",
        "error": error,
        "command": command,
        "refresh_ms": REFRESH_MS,
    }
    return render(
        request,
        "instances/page.html",
        context,
        user=public_user,
        page="instance",
        status_code=status_code,
    )


@router.get("/instances/{ref}")
def instance_page(ref: str, request: Request) -> Response:
    with tx(request) as session:
        user = viewer(session, request)
        if user is None:
            return RedirectResponse(login_url(request), status_code=303)
        return _page(request, session, user, ref)


@router.get("/partials/instances/{ref}")
def instance_live(ref: str, request: Request) -> Response:
    """The instance page's live parts (status, runs), re-rendered for live.js."""
    catalog = runtime(request).catalog
    with tx(request) as session:
        user = viewer(session, request)
        if user is None:
            return Response("log in again", status_code=401, media_type="text/plain")
        try:
            _, view = load_instance(session, user, catalog, ref)
        except NotFound as exc:
            return Response(exc.message, status_code=404, media_type="text/plain")
        public = UserPublic.model_validate(user)
    return render(request, "instances/live.html", {"view": view}, user=public)


def _wake_reconcilers(request: Request) -> None:
    request.app.state.wake_reconcilers()


def _act(
    request: Request,
    ref: str,
    action: Callable[[Session, Instance], str | None],
    *,
    notify: Callable[[Request], None] = _wake_reconcilers,
    command: str = "",
) -> Response:
    """A form's POST on the instance: `action` goes through a service and says where to go
    next (None: back to the instance page); once committed, `notify` wakes whoever acts on
    the change, then a 303 there. A refusal shows the page again, with `command` as typed."""
    if not same_origin(request):
        return cross_site_refusal(request)
    with tx(request) as session:
        user = viewer(session, request)
        if user is None:
            return RedirectResponse(login_url(request), status_code=303)
        try:
            with session.begin_nested():
                if not ref or len(ref) > MAX_REF:
                    raise NotFound(f"you have no instance {ref[:MAX_REF]!r}")
                target = action(session, lifecycle.get_instance(session, user, ref))
        except GpuleaseError as exc:
            return _page(
                request,
                session,
                user,
                ref,
                error=exc.message,
                command=command,
                status_code=exc.status,
            )
    notify(request)
    return RedirectResponse(target or f"/instances/{ref}", status_code=303)


@router.post("/instances/{ref}/stop")
def stop(ref: str, request: Request) -> Response:
    return _act(request, ref, lambda s, i: lifecycle.stop_instance(s, i))


@router.post("/instances/{ref}/start")
def start(ref: str, request: Request) -> Response:
    rt = runtime(request)
    return _act(
        request,
        ref,
        lambda s, i: lifecycle.start_instance(
            s, i, catalog=rt.catalog, min_start_minutes=rt.settings.min_start_minutes
        ),
    )


@router.post("/instances/{ref}/release")
def release(ref: str, request: Request) -> Response:
    return _act(request, ref, lambda s, i: lifecycle.release_instance(s, i))


@router.post("/instances/{ref}/runs")
def start_run(ref: str, request: Request, command: FormText = "") -> Response:
    """Start a command in the instance (as `gpulease exec`), then go to the run's page."""
    return _act(
        request,
        ref,
        lambda s, i: f"/runs/{runs.create_run(s, i, command, {}).id}",
        notify=lambda r: r.app.state.signals.runs.fire(),
        command=command,
    )
