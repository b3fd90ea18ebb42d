"""`gpulease backup` and `gpulease restore`, run on the server's host with its settings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.filesize import decimal
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from gpulease.cli.output import console, err_console, fail, note
from gpulease.cli.server import database_text, settings_error_text
from gpulease.core.errors import GpuleaseError

if TYPE_CHECKING:
    from gpulease.server.backups import Step
    from gpulease.server.backups.progress import Advance
    from gpulease.server.settings import Settings

# The backup machinery (and SQLAlchemy under it) loads inside the commands: the rest of the
# CLI starts without it.


class _AmountColumn(ProgressColumn):
    """'12.3 MB' or '4,096 rows', with the total when it is known."""

    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit", "bytes")

        def show(n: float) -> str:
            return decimal(int(n)) if unit == "bytes" else f"{int(n):,} rows"

        if task.total is None:
            return Text(show(task.completed))
        return Text(f"{show(task.completed)} / {show(task.total)}")


@contextmanager
def _progress() -> Iterator[Step]:
    bars = Progress(
        TextColumn("{task.description:<24}"),
        BarColumn(),
        TaskProgressColumn(),
        _AmountColumn(),
        TimeRemainingColumn(),
        console=err_console(),
    )

    def step(description: str, total: int | None, unit: str = "bytes") -> Advance:
        if not bars.live.is_started:
            bars.start()  # on the first step, so that a refusal prints nothing else
        task = bars.add_task(description, total=total, unit=unit)
        return lambda amount: bars.advance(task, amount)

    try:
        yield step
    finally:
        if bars.live.is_started:
            bars.stop()


def _settings() -> Settings:
    from gpulease.server.settings import Settings

    try:
        return Settings()
    except ValidationError as exc:
        fail(settings_error_text(exc), 2)


def _run(action: str, settings: Settings, call: Any) -> Any:
    from sqlalchemy.exc import SQLAlchemyError

    try:
        with _progress() as step:
            return call(step)
    except GpuleaseError as exc:
        fail(exc.message)
    except SQLAlchemyError as exc:
        fail(f"{action} failed on the database ({database_text(settings)}): {exc.__cause__ or exc}")
    except OSError as exc:
        fail(f"{action} failed: {exc}")


def backup(
    dest: Annotated[Path, typer.Argument(help="a new (or empty) directory for the backup")],
    include_keys: Annotated[
        bool,
        typer.Option(
            "--include-keys",
            help="also store the master key and the TLS key: then whoever holds the backup "
            "can read every dataset; keep such a backup as safe as the server itself",
        ),
    ] = False,
) -> None:
    """Back up this server's data (GPULEASE_* settings): database, blobs, workspaces at rest."""
    from gpulease.server.backups import create_backup

    settings = _settings()
    if include_keys:
        err_console().print(
            "[bold red]warning:[/bold red] the backup will contain the master key: anyone who "
            "gets it can decrypt every dataset. Store it encrypted, apart from other copies.",
            soft_wrap=True,
        )
    summary = _run(
        "the backup",
        settings,
        lambda step: create_backup(settings, dest, include_keys=include_keys, step=step),
    )
    out = console()
    rows = sum(summary.tables.values())
    out.print(
        f"backup written to [bold]{escape(str(dest))}[/bold]: {rows:,} rows in "
        f"{len(summary.tables)} tables, {len(summary.workspaces)} workspaces, "
        f"{decimal(sum(summary.files.values()))} of files",
        soft_wrap=True,
    )
    for instance_id, status in sorted(summary.skipped_workspaces.items()):
        note(
            f"workspace of instance {instance_id} left out: it is {status} (stop it to include it)"
        )
    if not include_keys:
        note(
            "the master key is not in the backup (pass --include-keys to add it); keep "
            f"{settings.master_key_path} safe elsewhere: a restore needs it back"
        )
    for warning in summary.warnings:
        note(warning)


def restore(
    src: Annotated[Path, typer.Argument(help="a directory written by `gpulease backup`")],
    force: Annotated[
        bool,
        typer.Option("--force", help="replace the data and database this server has now"),
    ] = False,
) -> None:
    """Restore a backup into this server's data directory and database (server stopped)."""
    from gpulease.server.backups import restore_backup

    settings = _settings()
    summary = _run(
        "the restore", settings, lambda step: restore_backup(settings, src, force=force, step=step)
    )
    rows = sum(summary.tables.values())
    console().print(
        f"restored {rows:,} rows in {len(summary.tables)} tables and "
        f"{len(summary.workspaces)} workspaces into {escape(str(settings.home))}"
        + (" (keys included)" if summary.keys_restored else ""),
        soft_wrap=True,
    )
    for warning in summary.warnings:
        err_console().print(
            f"[bold yellow]warning:[/bold yellow] {escape(warning)}", soft_wrap=True
        )
