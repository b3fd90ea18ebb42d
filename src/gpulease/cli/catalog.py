"""Catalog commands: GPU models with prices and availability, templates, nodes."""

from __future__ import annotations

from collections import Counter

from gpulease.cli.connection import logged_in_client
from gpulease.cli.output import (
    OutputFormat,
    OutputOption,
    add_row,
    print_json,
    show_table,
    table,
    when,
)
from gpulease.server.schemas import GpuModelPublic


def availability_text(model: GpuModelPublic) -> str:
    """'1/2', and say when the GPUs behind the count are simulated: '2/2 (simulated)'."""
    text = f"{model.free}/{model.total}"
    if model.simulated and model.simulated >= model.total:
        text += " (simulated)"
    elif model.simulated:
        text += f" ({model.simulated} simulated)"
    return text


def gpus(output: OutputOption = OutputFormat.table) -> None:
    """GPU models: memory, NCU factor, price per hour and how many are free now."""
    with logged_in_client() as client:
        models = client.gpus()
    if output is OutputFormat.json:
        print_json(models)
        return
    result = table("GPU", "MEMORY", "NCU FACTOR", "PRICE/H", "NCU/H", "DAY BLOCK", "FREE/TOTAL")
    for m in models:
        memory = f"{m.memory_gb:g} GB" if m.is_gpu else "-"
        add_row(
            result,
            m.name,
            memory,
            m.ncu_factor,
            m.hourly,
            m.hourly_ncu,
            m.daily,
            availability_text(m),
        )
    show_table(result, empty="the catalog is empty")


def templates(output: OutputOption = OutputFormat.table) -> None:
    """Environment templates an instance can start from."""
    with logged_in_client() as client:
        found = client.templates()
    if output is OutputFormat.json:
        print_json(found)
        return
    result = table("TEMPLATE", "PYTHON", "CUDA", "PACKAGES", "DESCRIPTION")
    for t in found:
        add_row(result, t.name, t.python, t.cuda or "-", ", ".join(t.packages), t.description)
    show_table(result, empty="no templates")


def nodes(output: OutputOption = OutputFormat.table) -> None:
    """GPU hosts and their state (admins only)."""
    with logged_in_client() as client:
        found = client.nodes()
    if output is OutputFormat.json:
        print_json(found)
        return
    result = table("NODE", "BACKEND", "STATUS", "GPUS", "IN USE", "DRIVER", "CUDA", "LAST SEEN")
    for n in found:
        counts = Counter(g.model or g.nvml_name for g in n.gpus)
        summary = ", ".join(f"{count}× {model}" for model, count in sorted(counts.items()))
        if any(g.simulated for g in n.gpus):
            summary += " (simulated)"
        in_use = sum(1 for g in n.gpus if g.instance_id is not None)
        add_row(
            result,
            n.name,
            n.backend,
            n.status,
            summary or "no GPUs",
            f"{in_use}/{len(n.gpus)}",
            n.driver_version or "-",
            n.cuda_version or "-",
            when(n.last_seen_at),
        )
    show_table(result, empty="no nodes registered")
