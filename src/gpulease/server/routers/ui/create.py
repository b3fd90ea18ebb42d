"""The console's "Create instance" form, with a live training estimate beside it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Form, Response
from sqlalchemy.orm import Session

from gpulease.core import estimates
from gpulease.core.catalog import CPU_MODEL, Catalog, share_text
from gpulease.core.errors import GpuleaseError, InvalidInput
from gpulease.core.money import format_credits
from gpulease.server.routers.ui.billing import PLAN_TEXTS
from gpulease.server.routers.ui.catalog import template_fits, usable_templates
from gpulease.server.routers.ui.forms import FormBody
from gpulease.server.routers.ui.guards import ConsolePage, FormViewer, PageViewer, console_router
from gpulease.server.services import nodes
from gpulease.server.services.billing import offpeak, plans, teams
from gpulease.server.services.datasets import library, mounts
from gpulease.server.services.instances import lifecycle

router = console_router()

PATH = "/instances/new"
MAX_FORM_GPUS = 64
PLAN_OPTIONS = {p.name: p.option for p in PLAN_TEXTS}


@dataclass(frozen=True)
class GpuChoice:
    name: str
    label: str
    is_gpu: bool
    free: int
    total: int
    simulated: bool


@dataclass(frozen=True)
class TemplateChoice:
    name: str
    description: str


class CreateForm(FormBody):
    """The create form as posted; the estimate fields only come back so that a refused form
    keeps them. A checkbox is "" when not ticked."""

    gpu_model: str = ""
    gpu_count: str = "1"
    template: str = "pytorch"
    name: str = ""
    plan: str = plans.ON_DEMAND
    team: str = ""
    auto_renew: str = ""
    start_when_cheap: str = ""
    datasets: list[str] = []
    model: str = "resnet50"
    images: str = ""
    epochs: str = ""
    image_size: str = ""


# What the form shows at first: one A100 and the estimate of a ResNet-50 ImageNet-like run.
CREATE_SHOWN = CreateForm(gpu_model="A100-80GB", images="100000", epochs="30", image_size="224")


def gpu_choices(session: Session, catalog: Catalog) -> list[GpuChoice]:
    """Catalog models with price, CPU and memory share and free/total, in catalog order;
    GPUs on offer first."""
    avail = nodes.availability(session, catalog)
    shares = nodes.shares_per_gpu(session, catalog)
    symbol = catalog.currency_symbol
    choices = []
    for m in catalog.models:
        a = avail[m.name]
        price = f"{format_credits(m.hourly_micro, symbol)}/h"
        share = f" · {share_text(*shares[m.name])}" if m.name in shares else ""
        if m.is_gpu:
            label = f"{m.name} · {m.memory_gb:g} GB · {price} per GPU · {a.free}/{a.total} free"
            if a.simulated:
                label += " (simulated)"
            label += f"{share} per GPU" if share else ""
        else:
            label = f"CPU only · {price}{share}"
        choices.append(GpuChoice(m.name, label, m.is_gpu, a.free, a.total, bool(a.simulated)))
    return sorted(choices, key=lambda c: (c.is_gpu and c.total == 0, not c.is_gpu))


def _page(console: ConsolePage, form: CreateForm, refusal: GpuleaseError | None = None) -> Response:
    session, user = console.session, console.user
    catalog = console.runtime.catalog
    choices = gpu_choices(session, catalog)
    if form.gpu_model not in {c.name for c in choices}:
        form = form.model_copy(update={"gpu_model": choices[0].name if choices else ""})
    # Per GPU model, why each template cannot run there: the option is shown disabled.
    reasons = {
        model: {f.template: f.reason or "no node runs this template" for f in found if not f.ok}
        for model, found in template_fits(session, user, catalog).items()
    }
    context = {
        "form": form,
        "gpus": choices,
        "reasons": reasons,
        "plans": [(p, PLAN_OPTIONS.get(p, p)) for p in plans.PLANS],
        "offpeak": bool(offpeak.list_windows(session)),
        "teams": [t.name for t in teams.my_teams(session, user)],
        "datasets": [d.name for d in library.list_datasets(session, user)],
        "templates": [
            TemplateChoice(v.template.name, v.template.description)
            for v in usable_templates(session, user, catalog)
        ],
        "models": estimates.MODELS,
        "limits": {
            "images": estimates.MAX_IMAGES,
            "epochs": estimates.MAX_EPOCHS,
            "min_size": estimates.MIN_IMAGE_SIZE,
            "max_size": estimates.MAX_IMAGE_SIZE,
            "gpus": MAX_FORM_GPUS,
        },
    }
    return console.form_page("instances/new.html", context, refusal, page="create")


@router.get(PATH)
def create_form(console: PageViewer) -> Response:
    return _page(console, CREATE_SHOWN)


def gpu_request(gpu_model: str, gpu_count: str) -> str | None:
    """The form's model and count as the API's MODEL:COUNT (None: CPU only)."""
    model = gpu_model.strip()
    if not model or model.upper() == CPU_MODEL:
        return None
    try:
        count = int(gpu_count.strip())
    except ValueError:
        raise InvalidInput(f"the GPU count must be a whole number, not {gpu_count!r}") from None
    if not 1 <= count <= MAX_FORM_GPUS:
        raise InvalidInput(f"the GPU count must be from 1 to {MAX_FORM_GPUS}")
    return f"{model}:{count}"


@router.post(PATH)
def create(console: FormViewer, form: Annotated[CreateForm, Form()]) -> Response:
    """Create through the same service as POST /api/v1/instances, then go to its page."""
    rt = console.runtime
    typed = form.model_copy(
        update={"name": form.name.strip(), "datasets": [d for d in form.datasets if d]}
    )

    def act() -> str:
        instance = lifecycle.create_instance(
            console.session,
            console.user,
            catalog=rt.catalog,
            gpu=gpu_request(typed.gpu_model, typed.gpu_count),
            template=typed.template.strip(),
            name=typed.name or None,
            auto_release=False,
            min_start_minutes=rt.settings.min_start_minutes,
            workspaces=rt.settings.workspaces_path,
            plan=typed.plan.strip() or plans.ON_DEMAND,
            team=typed.team.strip() or None,
            auto_renew=bool(typed.auto_renew),
            start_when_cheap=bool(typed.start_when_cheap),
        )
        if typed.datasets:
            mounts.attach_datasets(console.session, console.user, instance, typed.datasets)
        console.wake_reconcilers()
        return f"/instances/{instance.id}"

    return console.act(act, lambda exc: _page(console, typed, exc))
