"""Catalog commands: GPU models with prices and availability, templates, nodes."""

from __future__ import annotations

import time
from collections import Counter
from typing import Annotated

import typer

from gpulease.cli.connection import fetch, logged_in_client
from gpulease.cli.output import (
    OutputFormat,
    OutputOption,
    console,
    emit,
    fail,
    print_json,
    show_rows,
    when,
)
from gpulease.core import catalog
from gpulease.schemas.catalog import (
    GpuModelPublic,
    NodePublic,
    TemplateAvailabilityPublic,
    TemplatePublic,
    TemplateSave,
)

SAVE_POLL_S = 0.5
SAVE_TIMEOUT_S = 300.0


def availability_text(model: GpuModelPublic) -> str:
    """'1/2', and say when the GPUs behind the count are simulated: '2/2 (simulated)'."""
    text = f"{model.free}/{model.total}"
    if model.simulated and model.simulated >= model.total:
        text += " (simulated)"
    elif model.simulated:
        text += f" ({model.simulated} simulated)"
    return text


def share_text(model: GpuModelPublic, count: int = 1) -> str:
    """'8 vCPU, 64 GB RAM': the CPU and memory share of count GPUs (of a CPU-only
    instance for CPU); '-' when no node has the model."""
    if model.vcpus_per_gpu is None or model.ram_gb_per_gpu is None:
        return "-"
    count = max(count, 1)
    return catalog.share_text(model.vcpus_per_gpu * count, model.ram_gb_per_gpu * count)


def _availability_cell(item: TemplateAvailabilityPublic) -> str:
    if not item.available:
        return f"no: {item.reason}"
    return f"yes ({item.note})" if item.note else "yes"


def gpus(
    output: OutputOption = OutputFormat.table,
    template: Annotated[
        str | None,
        typer.Option(
            "--template", "-t", help="also say whether each model runs this template, or why not"
        ),
    ] = None,
) -> None:
    """GPU models: memory, NCU factor, price per hour and how many are free now."""
    with logged_in_client() as client:
        models = client.catalog.gpus()
        fits = {a.model: a for a in client.templates.availability(template)} if template else {}
    if output is OutputFormat.json:
        if not template:
            print_json(models)
            return
        rows = []
        for m in models:
            row = m.model_dump(mode="json")
            row["template"] = fits[m.name].model_dump(mode="json") if m.name in fits else None
            rows.append(row)
        print_json({"template": template, "models": rows})
        return
    headers = ["GPU", "MEMORY", "NCU FACTOR", "PRICE/H", "NCU/H", "DAY BLOCK", "FREE/TOTAL"]
    headers.append("CPU/RAM PER GPU")
    if template:
        headers.append(f"TEMPLATE {template}")

    def cells(m: GpuModelPublic) -> list[object]:
        memory = f"{m.memory_gb:g} GB" if m.is_gpu else "-"
        cells: list[object] = [m.name, memory, m.ncu_factor, m.hourly, m.hourly_ncu, m.daily]
        cells.append(availability_text(m))
        cells.append(share_text(m))
        if template:
            cells.append(_availability_cell(fits[m.name]) if m.name in fits else "-")
        return cells

    show_rows(models, headers, cells, empty="the catalog is empty")


templates_app = typer.Typer(
    help="Environment templates: list them with where they run; save an instance's as yours.",
    invoke_without_command=True,
)


def _short(note: str) -> str:
    """A model's note in a table cell; `-o json` has the whole sentence."""
    if "runs on the CPU" in note:
        return "CPU mode"
    if "minor-version compatibility" in note:
        return "minor-version compat"
    return note


def _runs_on(t: TemplatePublic) -> tuple[str, str]:
    """(the models it runs on, the models it cannot run on with the reason)."""
    good = []
    bad = []
    for a in t.availability:
        if a.available:
            good.append(f"{a.model} ({_short(a.note)})" if a.note else a.model)
        elif not (a.reason or "").startswith("no node offers"):
            bad.append(f"{a.model}: {a.reason}")
    return ", ".join(good) or "-", "; ".join(bad) or "-"


@templates_app.callback()
def templates(ctx: typer.Context, output: OutputOption = OutputFormat.table) -> None:
    """Environment templates an instance can start from: built-in ones and your own
    (mine/NAME), each with the GPU models whose nodes run it and, where not, why."""
    if ctx.invoked_subcommand is not None:
        return
    emit(fetch(lambda client: client.templates.list()), output, _show_templates)


def _show_templates(found: list[TemplatePublic]) -> None:
    show_rows(
        found,
        ("TEMPLATE", "BUILD", "PYTHON", "CUDA", "RUNS ON", "UNAVAILABLE", "DESCRIPTION"),
        _template_cells,
        empty="no templates",
    )


def _template_cells(t: TemplatePublic) -> tuple[object, ...]:
    name = t.name if t.status == "ready" else f"{t.name} ({t.status})"
    runs_on, unavailable = _runs_on(t)
    if t.status == "failed":
        unavailable = t.error or "failed"
    elif t.status == "pending":
        runs_on = "- (being saved)"
    return (name, t.label, t.python, t.cuda or "-", runs_on, unavailable, t.description)


@templates_app.command("save")
def save(
    instance: Annotated[str, typer.Argument(help="the running instance (name or id)")],
    name: Annotated[str, typer.Argument(help="the new template's name; use it as mine/NAME")],
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="wait until the runner has saved it")
    ] = True,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Save a running instance's environment (its venv's `pip freeze`) as your template."""
    with logged_in_client() as client:
        saved = client.templates.save(instance, TemplateSave(name=name))
        deadline = time.monotonic() + SAVE_TIMEOUT_S
        while wait and saved.status == "pending" and time.monotonic() < deadline:
            time.sleep(SAVE_POLL_S)
            saved = next((t for t in client.templates.list() if t.name == saved.name), saved)
    emit(saved, output, _show_save)


def _show_save(saved: TemplatePublic) -> None:
    if saved.status == "failed":
        fail(f"template {saved.name} could not be saved: {saved.error}")
    if saved.status == "pending":
        console().print(
            f"saving {saved.name}: the runner has not answered yet; see `gpulease templates`"
        )
        return
    console().print(
        f"saved {saved.name} ({len(saved.packages)} packages); start an instance from it with "
        f"`gpulease instance create --template {saved.name}`"
    )


@templates_app.command("rm")
def remove(
    name: Annotated[str, typer.Argument(help="your template, as mine/NAME or NAME")],
) -> None:
    """Delete one of your own templates."""
    with logged_in_client() as client:
        client.templates.delete(name)
    console().print(f"deleted mine/{name.removeprefix('mine/')}")


def nodes(output: OutputOption = OutputFormat.table) -> None:
    """GPU hosts and their state (admins only)."""
    emit(fetch(lambda client: client.catalog.nodes()), output, _show_nodes)


def _show_nodes(found: list[NodePublic]) -> None:
    show_rows(
        found,
        ("NODE", "BACKEND", "STATUS", "GPUS", "IN USE", "DRIVER", "CUDA", "LAST SEEN"),
        _node_cells,
        empty="no nodes registered",
    )


def _node_cells(n: NodePublic) -> tuple[object, ...]:
    counts = Counter(g.model or g.nvml_name for g in n.gpus)
    summary = ", ".join(f"{count}× {model}" for model, count in sorted(counts.items()))
    if any(g.simulated for g in n.gpus):
        summary += " (simulated)"
    in_use = sum(1 for g in n.gpus if g.instance_id is not None)
    return (
        n.name,
        n.backend,
        n.status,
        summary or "no GPUs",
        f"{in_use}/{len(n.gpus)}",
        n.driver_version or "-",
        n.cuda_version or "-",
        when(n.last_seen_at),
    )
