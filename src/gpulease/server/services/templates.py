"""Templates as users see them: built-in and own ones, which nodes run them, saving an env.

Names: a built-in template by its name (`pytorch-cu130`), a user's own as `mine/NAME`.
`mine/` always means the caller's own templates, so another user's template can never be
named, let alone used: asking for it is simply "not found".
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpulease.core.catalog import CPU_MODEL, Catalog
from gpulease.core.errors import Conflict, InvalidInput, NotFound
from gpulease.core.names import NameRule
from gpulease.core.templates import BUILTIN_TEMPLATES, Template, find_builtin, get_template
from gpulease.envs.compat import NodeFacts, check, compatible_templates, note
from gpulease.scheduler.fifo import Request
from gpulease.server.db import batches, utcnow
from gpulease.server.orm import Gpu, Instance, Node, User, UserTemplate
from gpulease.server.services.instances.states import RELEASED, RUNNING
from gpulease.server.services.rows import find_all, get_owned, insert

USER_PREFIX = "mine/"
TEMPLATE_NAME = NameRule("template name", 1, 48, why="it is then used as mine/NAME")
PENDING, READY, FAILED = "pending", "ready", "failed"
# A `pip freeze` line the recipe keeps: NAME==VERSION (editable installs and local paths
# cannot be rebuilt elsewhere and are left out).
_PINNED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+$")
MAX_PACKAGES = 2000
SNAPSHOT_TASK = "snapshot_env"


# -- resolving names ---------------------------------------------------------------------------


def user_template_name(name: str) -> str | None:
    """'mine/foo' -> 'foo'; None for a built-in name."""
    return name[len(USER_PREFIX) :] if name.startswith(USER_PREFIX) else None


def _own_row(session: Session, owner_id: int, short: str) -> UserTemplate | None:
    return session.scalar(
        select(UserTemplate).where(UserTemplate.owner_id == owner_id, UserTemplate.name == short)
    )


def as_template(row: UserTemplate) -> Template:
    """A user's template as a recipe. pip options and the framework label come from the
    built-in template it was saved from (its `+cpu`/`+cu126` pins need that index)."""
    base = find_builtin(row.base_template)
    return Template(
        name=f"{USER_PREFIX}{row.name}",
        description=f"saved by its owner from an instance of {row.base_template}",
        python=row.python,
        packages=tuple(row.packages),
        cuda=row.cuda,
        extra_index_urls=base.extra_index_urls if base else (),
        framework=base.framework if base else "",
    )


def resolve(session: Session, owner_id: int, name: str) -> Template:
    """The recipe `name` means for this owner. Raises NotFound for an own template the owner
    does not have (also another user's), InvalidInput for an unknown built-in name, and
    Conflict for an own template that is not saved yet."""
    short = user_template_name(name)
    if short is None:
        return get_template(name)
    row = _own_row(session, owner_id, short)
    if row is None:
        raise NotFound(f"you have no template {name!r}; see `gpulease templates`")
    _expire_if_orphaned(session, row)
    if row.status == PENDING:
        raise Conflict(f"template {name} is still being saved; try again in a moment")
    if row.status == FAILED:
        raise Conflict(f"template {name} could not be saved: {row.error}; save it again")
    return as_template(row)


# -- which nodes run what ----------------------------------------------------------------------


@dataclass(frozen=True)
class _NodeModels:
    """A node and how many GPUs of each model it has (real, simulated, free)."""

    node_id: int
    name: str
    ready: bool
    driver_version: str | None
    real: dict[str, int]
    simulated: dict[str, int]
    free: dict[str, int]

    def facts(self, model: str | None = None) -> NodeFacts:
        real = sum(self.real.values()) if model is None else self.real.get(model, 0)
        simulated = sum(self.simulated.values()) if model is None else self.simulated.get(model, 0)
        # A model present only as simulated GPUs never reaches CUDA: it runs as on a CPU host.
        driver = self.driver_version if real or model is None else None
        return NodeFacts(self.name, driver, real_gpus=real, simulated_gpus=simulated)

    def offers(self, model: str) -> bool:
        return bool(self.real.get(model) or self.simulated.get(model))


def _nodes(session: Session) -> list[_NodeModels]:
    counts = session.execute(
        select(
            Gpu.node_id,
            Gpu.model,
            Gpu.simulated,
            func.count(Gpu.id),
            func.count(Gpu.id).filter(Gpu.instance_id.is_(None)),
        )
        .where(Gpu.present.is_(True), Gpu.model.is_not(None))
        .group_by(Gpu.node_id, Gpu.model, Gpu.simulated)
    ).all()
    per_node: dict[int, tuple[dict[str, int], dict[str, int], dict[str, int]]] = defaultdict(
        lambda: ({}, {}, {})
    )
    for node_id, model, simulated, total, free in counts:
        real_counts, sim_counts, free_counts = per_node[int(node_id)]
        target = sim_counts if simulated else real_counts
        target[str(model)] = target.get(str(model), 0) + int(total)
        free_counts[str(model)] = free_counts.get(str(model), 0) + int(free)
    result = []
    for node in session.scalars(select(Node).order_by(Node.id)):
        real_counts, sim_counts, free_counts = per_node[node.id]
        result.append(
            _NodeModels(
                node.id,
                node.name,
                node.status == "ready",
                node.driver_version,
                real_counts,
                sim_counts,
                free_counts,
            )
        )
    return result


@dataclass(frozen=True)
class ModelAvailability:
    """Whether instances of `model` can use a template, for the catalog and the create form.

    free/total count the GPUs of the model on nodes that run the template (for the CPU
    model: nodes). available False comes with the reason; note says how it runs when it
    runs in a reduced way (on the CPU, through CUDA minor-version compatibility).
    """

    model: str
    available: bool
    reason: str | None
    note: str | None
    free: int
    total: int


def _model_availability(
    template: Template, model: str, nodes: Sequence[_NodeModels]
) -> ModelAvailability:
    if model == CPU_MODEL:
        return ModelAvailability(
            model,
            bool(nodes),
            None if nodes else "no node is registered",
            None,
            sum(n.ready for n in nodes),
            len(nodes),
        )
    offering = [n for n in nodes if n.offers(model)]
    if not offering:
        return ModelAvailability(model, False, f"no node offers {model}", None, 0, 0)
    good = [n for n in offering if check(template, n.facts(model)) is None]
    if not good:
        reason = check(template, offering[0].facts(model))
        return ModelAvailability(model, False, reason, None, 0, 0)
    notes = [text for n in good if (text := note(template, n.facts(model)))]
    return ModelAvailability(
        model,
        True,
        None,
        notes[0] if notes else None,
        sum(n.free.get(model, 0) for n in good if n.ready),
        sum(n.real.get(model, 0) + n.simulated.get(model, 0) for n in good),
    )


def template_availability(
    session: Session, template_name: str, owner: User, catalog: Catalog | None = None
) -> list[ModelAvailability]:
    """For each GPU model (the catalog's, else those nodes have), whether an instance of it
    can run template_name, and why not. Raises like resolve() for an unknown name."""
    template = resolve(session, owner.id, template_name)
    nodes = _nodes(session)
    if catalog is not None:
        models = [m.name for m in catalog.models]
    else:
        found = {model for n in nodes for model in (*n.real, *n.simulated)}
        models = [CPU_MODEL, *sorted(found)]
    return [_model_availability(template, model, nodes) for model in models]


def alternatives(session: Session, model: str, exclude: str) -> list[str]:
    """Built-in CUDA templates that some node offering `model` runs on its GPUs."""
    names: list[str] = []
    for node in _nodes(session):
        if not node.real.get(model):
            continue
        for template in compatible_templates(list(BUILTIN_TEMPLATES), node.driver_version):
            if template.name != exclude and template.name not in names:
                names.append(template.name)
    return names


def check_fits(session: Session, owner_id: int, template_name: str, model: str, count: int) -> None:
    """Refuse (409) an instance no node of its model can ever run: the driver of every node
    that offers the model is too old for the template. Unknown names fail as in resolve()."""
    template = resolve(session, owner_id, template_name)
    if count == 0:
        return
    found = _nodes(session)
    if not any(node.offers(model) for node in found):
        return  # no node offers the model at all: nodes.check_request_fits says so
    availability = _model_availability(template, model, found)
    if availability.available:
        return
    others = alternatives(session, model, template.name)
    hint = f"pick {' or '.join(others[:3])}" if others else "pick a CPU template"
    raise Conflict(
        f"template {template_name} cannot run on any {model} node: {availability.reason}. "
        f"{hint.capitalize()} or ask the operator to update the driver"
    )


def restrict_queue(
    session: Session, queue: Sequence[Request]
) -> tuple[list[Request], dict[int, str]]:
    """The queue with each request limited to the nodes whose driver runs its template,
    and the instances to refuse (id -> reason): those no node offering their model can run
    any more (a node's driver was downgraded), or whose own template is gone."""
    if not queue:
        return [], {}
    nodes = _nodes(session)
    instances = {
        i.id: i
        for batch in batches(sorted(r.instance_id for r in queue))
        for i in session.scalars(select(Instance).where(Instance.id.in_(batch)))
    }
    restricted: list[Request] = []
    refused: dict[int, str] = {}
    for req in queue:
        instance = instances.get(req.instance_id)
        if instance is None:
            continue
        try:
            template = resolve(session, instance.owner_id, instance.template)
        except (NotFound, Conflict, InvalidInput) as exc:
            refused[req.instance_id] = f"not started: {exc.message}"
            continue
        if req.count == 0:
            restricted.append(req)
            continue
        offering = [n for n in nodes if n.offers(req.model)]
        allowed = frozenset(
            n.node_id for n in offering if check(template, n.facts(req.model)) is None
        )
        if offering and not allowed:
            reason = check(template, offering[0].facts(req.model))
            refused[req.instance_id] = f"not started: {reason}"
            continue
        restricted.append(replace(req, nodes=allowed if offering else None))
    return restricted, refused


# -- listing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TemplateView:
    template: Template
    own: bool
    status: str
    error: str | None
    availability: list[ModelAvailability]


def list_templates(
    session: Session, owner: User, catalog: Catalog | None = None
) -> list[TemplateView]:
    """Built-in templates, then the owner's own, each with where it can run."""
    nodes = _nodes(session)
    models = (
        [m.name for m in catalog.models]
        if catalog is not None
        else [CPU_MODEL, *sorted({m for n in nodes for m in (*n.real, *n.simulated)})]
    )

    def where(template: Template) -> list[ModelAvailability]:
        return [_model_availability(template, model, nodes) for model in models]

    views = [TemplateView(t, False, READY, None, where(t)) for t in BUILTIN_TEMPLATES]
    for row in own_templates(session, owner):
        template = as_template(row)
        views.append(
            TemplateView(
                template,
                True,
                row.status,
                row.error,
                where(template) if row.status == READY else [],
            )
        )
    return views


def own_templates(session: Session, owner: User) -> list[UserTemplate]:
    rows = list(
        session.scalars(
            select(UserTemplate).where(UserTemplate.owner_id == owner.id).order_by(UserTemplate.id)
        )
    )
    for row in rows:
        _expire_if_orphaned(session, row)
    return rows


def _expire_if_orphaned(session: Session, row: UserTemplate) -> None:
    """A pending save whose instance stopped before its runner answered has failed."""
    if row.status != PENDING or row.instance_id is None:
        return
    instance = session.get(Instance, row.instance_id)
    if instance is None or instance.status != RUNNING:
        row.status = FAILED
        row.error = "the instance stopped before its environment was saved"


# -- saving an instance's environment ----------------------------------------------------------


def save_from_instance(
    session: Session, owner: User, instance: Instance, name: str
) -> UserTemplate:
    """Queue a snapshot of a running instance's venv as the owner's template `name`; the
    runner answers with `pip freeze` (record_result)."""
    short = user_template_name(name) or name
    if not TEMPLATE_NAME.pattern.fullmatch(short):
        raise InvalidInput(f"{name!r} is not a valid {TEMPLATE_NAME.what}: {TEMPLATE_NAME.rule}")
    if instance.status != RUNNING:
        raise Conflict(
            f"instance {instance.name} is {instance.status}: its environment can be saved only "
            "while it runs; start it first"
        )
    base = resolve(session, owner.id, instance.template)
    base_name = instance.template
    if user_template_name(instance.template) is not None:
        row = _own_row(session, owner.id, user_template_name(instance.template) or "")
        base_name = row.base_template if row is not None else instance.template
    existing = _own_row(session, owner.id, short)
    if existing is not None:
        _expire_if_orphaned(session, existing)
        if existing.status != FAILED:
            raise Conflict(f"you already have a template mine/{short}; pick another name")
        session.delete(existing)
        session.flush()
    row = UserTemplate(
        owner_id=owner.id,
        name=short,
        base_template=base_name,
        python=base.python,
        packages=[],
        cuda=base.cuda,
        status=PENDING,
        error=None,
        instance_id=instance.id,
        created_at=utcnow(),
    )
    return insert(session, row)


def pending_tasks(session: Session, instance: Instance) -> list[UserTemplate]:
    """Snapshot tasks the instance's runner has not answered yet."""
    return find_all(
        session,
        UserTemplate,
        UserTemplate.instance_id == instance.id,
        UserTemplate.status == PENDING,
    )


def pinned_packages(lines: Iterable[str]) -> tuple[list[str], list[str]]:
    """`pip freeze` lines split into the pins a recipe keeps and the lines it leaves out."""
    kept: list[str] = []
    skipped: list[str] = []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        (kept if _PINNED.match(line) else skipped).append(line)
    return kept, skipped


def record_result(
    session: Session,
    instance: Instance,
    task_id: int,
    packages: list[str] | None,
    error: str | None,
) -> None:
    """Store the runner's answer to snapshot task `task_id`. Idempotent: a repeated answer
    for a task already done changes nothing. Another instance's task is not found."""
    missing = f"this instance has no task {task_id}"
    row = get_owned(session, UserTemplate, task_id, missing, instance_id=instance.id)
    if row.status != PENDING:
        return
    if error is not None:
        row.status = FAILED
        row.error = error[:2000]
        return
    kept, skipped = pinned_packages(packages or [])
    if len(kept) > MAX_PACKAGES:
        row.status, row.error = (
            FAILED,
            f"pip freeze listed {len(kept)} packages; the limit is {MAX_PACKAGES}",
        )
        return
    row.packages = sorted(kept, key=str.lower)
    row.status = READY
    row.error = (
        None
        if not skipped
        else f"left out (cannot be rebuilt elsewhere): {', '.join(skipped[:10])}"
    )


def delete_template(session: Session, owner: User, name: str) -> None:
    """Delete the owner's template `name` (mine/NAME or NAME). Refused while an instance
    that is not released still uses it (it would not start again)."""
    short = user_template_name(name) or name
    row = _own_row(session, owner.id, short)
    if row is None:
        raise NotFound(f"you have no template mine/{short}; see `gpulease templates`")
    users = list(
        session.scalars(
            select(Instance.name).where(
                Instance.owner_id == owner.id,
                Instance.template == f"{USER_PREFIX}{short}",
                Instance.status != RELEASED,
                Instance.desired_state != "released",  # being released: never starts again
            )
        )
    )
    if users:
        raise Conflict(
            f"template mine/{short} is used by your instance(s) {', '.join(sorted(users))}; "
            "release them first"
        )
    session.delete(row)
