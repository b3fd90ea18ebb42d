"""Templates: the list with where each runs, one template's availability, saving an env;
and the runner's answer to a snapshot task."""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks, Request, Response

from gpulease.core.records import from_attributes
from gpulease.schemas.catalog import TemplateAvailabilityPublic, TemplatePublic, TemplateSave
from gpulease.schemas.runner import RUNNER_API, RunnerTaskResult
from gpulease.server.routers.deps import CurrentUser, IdPath, RunnerInstance, SessionDep, runtime
from gpulease.server.services import templates
from gpulease.server.services.instances import lifecycle

router = APIRouter(tags=["templates"])
runner_router = APIRouter(prefix=RUNNER_API, tags=["runner"])


def _availability(items: list[templates.ModelAvailability]) -> list[TemplateAvailabilityPublic]:
    return [TemplateAvailabilityPublic.model_validate(a) for a in items]


def _public(view: templates.TemplateView) -> TemplatePublic:
    return from_attributes(
        TemplatePublic,
        view.template,
        own=view.own,
        status=view.status,
        error=view.error,
        availability=_availability(view.availability),
    )


@router.get("/templates")
def list_templates(
    session: SessionDep, user: CurrentUser, request: Request
) -> list[TemplatePublic]:
    """Built-in templates and the caller's own, each with, per GPU model, whether it runs."""
    catalog = runtime(request).catalog
    return [_public(v) for v in templates.list_templates(session, user, catalog)]


@router.get("/templates/{name:path}/availability")
def template_availability(
    name: str, session: SessionDep, user: CurrentUser, request: Request
) -> list[TemplateAvailabilityPublic]:
    catalog = runtime(request).catalog
    return _availability(templates.template_availability(session, name, user, catalog))


@router.post("/instances/{ref}/save-template", status_code=202)
def save_template(
    ref: str,
    body: TemplateSave,
    session: SessionDep,
    user: CurrentUser,
    request: Request,
    after: BackgroundTasks,
) -> TemplatePublic:
    """Queue a snapshot of the instance's venv as mine/NAME; it is ready once the runner
    answered (status pending until then)."""
    instance = lifecycle.get_instance(session, user, ref)
    row = templates.save_from_instance(session, user, instance, body.name)
    after.add_task(request.app.state.signals.runs.fire)  # wakes the runner's long poll
    return _public(
        templates.TemplateView(templates.as_template(row), True, row.status, row.error, [])
    )


@runner_router.post("/tasks/{task_id}/result", status_code=204)
def task_result(
    task_id: IdPath, body: RunnerTaskResult, session: SessionDep, instance: RunnerInstance
) -> Response:
    templates.record_result(session, instance, task_id, body.packages, body.error)
    return Response(status_code=204)


@router.delete("/templates/mine/{name}", status_code=204)
def delete_template(name: str, session: SessionDep, user: CurrentUser) -> Response:
    """Delete one of your own templates (refused while an instance still uses it)."""
    templates.delete_template(session, user, name)
    return Response(status_code=204)
