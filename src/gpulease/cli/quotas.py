"""`gpulease admin quota`: the most GPUs a user's or a team's instances may hold at once."""

from __future__ import annotations

from typing import Annotated

import typer

from gpulease.cli.connection import fetch
from gpulease.cli.output import OutputFormat, OutputOption, console, emit, emit_rows, fail

quota_app = typer.Typer(help="GPU quotas: the most GPUs a user or team holds at once.")


@quota_app.command("ls")
def quota_ls(output: OutputOption = OutputFormat.table) -> None:
    """Every GPU quota set."""
    emit_rows(
        fetch(lambda client: client.admin.quotas()),
        output,
        ("KIND", "NAME", "MAX GPUS"),
        lambda q: (q.kind, q.name, q.max_gpus),
        empty="no quotas: nobody is capped",
    )


@quota_app.command("set")
def quota_set(
    max_gpus: Annotated[str, typer.Argument(help="GPUs, or 'none' to lift the cap")],
    user: Annotated[str | None, typer.Option("--user", help="a user's name")] = None,
    team: Annotated[str | None, typer.Option("--team", help="a team's name")] = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Cap the GPUs a user's (--user) or a team's (--team) instances may hold at once."""
    if (user is None) == (team is None):
        fail("name one of --user NAME or --team NAME")
    cap: int | None = None
    if max_gpus.lower() != "none":
        if not max_gpus.isdigit():
            fail(f"{max_gpus!r} is not a number of GPUs; give one, like 8, or 'none'")
        cap = int(max_gpus)
    kind, name = ("user", user) if user is not None else ("team", team)
    assert name is not None
    quota = fetch(lambda client: client.admin.set_quota(kind, name, cap))
    emit(
        quota,
        output,
        lambda q: console().print(
            f"{q.kind} {q.name}: "
            + ("no GPU cap" if q.max_gpus is None else f"at most {q.max_gpus} GPUs at once"),
            markup=False,
        ),
    )
