"""Dataset commands: push a directory, list, show, remove; and rotating the master key."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from gpulease.cli import output as out
from gpulease.cli.connection import fetch, logged_in_client
from gpulease.cli.push_words import push_report, unchanged_text
from gpulease.core.datasets import format_bytes
from gpulease.schemas.datasets import DatasetDetail, DatasetList
from gpulease.storage.chunking import without_cyclic_gc

EXIT_INTERRUPTED = 130

dataset_app = typer.Typer(
    help="Datasets: push a directory once, mount it read-only at /data/NAME in instances.",
    no_args_is_help=True,
)

NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="dataset name")]


class BarProgress:
    """The push's progress bar on stderr: files, bytes, rate and time left."""

    def __init__(self) -> None:
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[files]}"),
            DownloadColumn(binary_units=False),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=out.err_console(),
            transient=False,
        )
        self.task: TaskID | None = None
        self.files = 0
        self.total_files = 0

    def started(self, files: int, size: int) -> None:
        self.total_files = files
        self.task = self.bar.add_task("push", total=max(size, 1), files=self._files_text())

    def advanced(self, files: int, size: int) -> None:
        self.files += files
        if self.task is not None:
            self.bar.update(self.task, advance=size, files=self._files_text())

    def _files_text(self) -> str:
        return f"{self.files:,}/{self.total_files:,} files"


@dataset_app.command("push")
def push(
    directory: Annotated[
        Path, typer.Argument(metavar="DIR", help="the directory to push", show_default=False)
    ],
    name: Annotated[
        str | None,
        typer.Option("--name", "-n", help="dataset name (default: the directory's name)"),
    ] = None,
    output: out.OutputOption = out.OutputFormat.table,
) -> None:
    """Push DIR as a new version of dataset NAME (only what the server lacks is sent).

    Interrupt it and run it again to resume.
    """
    name = name or directory.resolve().name
    progress = BarProgress()
    with logged_in_client() as client:
        try:
            # The collector off while the push makes its tuples (a few per file, no cycles):
            # each full collection they set off went through every object of the CLI.
            with progress.bar, without_cyclic_gc():
                result = client.datasets.push(directory, name, progress=progress)
        except KeyboardInterrupt:
            out.note(
                "interrupted: run the same command again to resume; only what the server "
                "does not have yet will be sent"
            )
            raise typer.Exit(EXIT_INTERRUPTED) from None
    if output is out.OutputFormat.json:
        out.print_json(
            push_report(
                result.dataset.model_dump(mode="json"),
                push_id=result.push_id,
                files=result.files,
                size=result.size,
                sent_chunks=result.sent_chunks,
                sent_bytes=result.sent_bytes,
                index_hits=result.index_hits,
                unchanged=result.unchanged,
                seconds=result.seconds,
            )
        )
        return
    if result.unchanged:
        dataset = result.dataset
        words = unchanged_text(
            dataset.name, dataset.current_version, result.files, result.size, result.seconds
        )
        out.console().print(words, markup=False)
        return
    rate = result.files / max(result.seconds, 1e-6)
    shared = " (the rest was on the server already)" if result.sent_bytes < result.size else ""
    out.console().print(
        f"pushed {result.dataset.name} v{result.dataset.current_version}: "
        f"{result.files:,} files, {format_bytes(result.size)}; sent "
        f"{format_bytes(result.sent_bytes)}{shared} in "
        f"{result.seconds:.1f} s, {rate:,.0f} files/s",
        markup=False,
    )


@dataset_app.command("ls")
def list_(output: out.OutputOption = out.OutputFormat.table) -> None:
    """Your datasets and your storage use."""
    out.emit(fetch(lambda client: client.datasets.list()), output, _show_datasets)


def _show_datasets(found: DatasetList) -> None:
    result = out.table("NAME", "VERSION", "FILES", "SIZE", "UPDATED")
    for d in found.datasets:
        out.add_row(
            result,
            d.name,
            f"v{d.current_version}",
            f"{d.file_count:,}",
            format_bytes(d.size_bytes),
            out.when(d.updated_at),
        )
    out.show_table(
        result, empty="no datasets; push one with `gpulease dataset push DIR --name NAME`"
    )
    usage = found.usage
    out.note(
        f"storage: {format_bytes(usage.used_bytes)} of {format_bytes(usage.quota_bytes)} "
        "(content shared by datasets counts once)"
    )


@dataset_app.command("show")
def show(name: NameArgument, output: out.OutputOption = out.OutputFormat.table) -> None:
    """A dataset: its versions and its recent pushes."""
    out.emit(fetch(lambda client: client.datasets.get(name)), output, _show_dataset)


def _show_dataset(detail: DatasetDetail) -> None:
    d = detail.dataset
    out.show_fields(
        [
            ("name", d.name),
            ("version", f"v{d.current_version}"),
            ("files", f"{d.file_count:,}"),
            ("size", format_bytes(d.size_bytes)),
            ("mount", f"/data/{d.name} (read-only)"),
            ("mounted by", ", ".join(detail.mounted_by)),
            ("created", out.when(d.created_at)),
            ("updated", out.when(d.updated_at)),
        ]
    )
    versions = out.table("VERSION", "FILES", "SIZE", "CHUNKS", "CREATED", title="versions")
    for v in detail.versions:
        out.add_row(
            versions,
            f"v{v.number}",
            f"{v.file_count:,}",
            format_bytes(v.size_bytes),
            f"{v.chunk_count:,}",
            out.when(v.created_at),
        )
    out.show_table(versions, empty="no versions")
    pushes = out.table("PUSH", "STATE", "VERSION", "RECEIVED", "CHUNKS", "STARTED", title="pushes")
    for p in detail.pushes:
        out.add_row(
            pushes,
            p.id,
            p.state + (f": {p.state_reason}" if p.state_reason else ""),
            f"v{p.version}" if p.version else None,
            format_bytes(p.bytes_received),
            f"{p.chunks_received:,}",
            out.when(p.created_at),
        )
    out.show_table(pushes, empty="no pushes")


@dataset_app.command("rm")
def remove(name: NameArgument, output: out.OutputOption = out.OutputFormat.table) -> None:
    """Remove a dataset and all its versions (refused while an instance mounts it)."""
    with logged_in_client() as client:
        removed = client.datasets.remove(name)
    out.emit(
        removed,
        output,
        lambda removed: out.console().print(
            f"removed dataset {removed.name}; freed {format_bytes(removed.freed_bytes)}",
            markup=False,
        ),
    )


def rotate_master_key() -> None:
    """Re-wrap every dataset key under a new master key (run it on the server host, with
    the server's GPULEASE_* settings). The data stays readable; the old key stops working."""
    from sqlalchemy.exc import SQLAlchemyError

    from gpulease.cli.server import settings_error_text
    from gpulease.core.errors import GpuleaseError
    from gpulease.server.db import make_engine, make_sessionmaker
    from gpulease.server.services.datasets.keys import rotate_master_key as rotate
    from gpulease.server.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        out.fail(settings_error_text(exc), 2)
    path = settings.master_key_path
    if not path.exists():
        out.fail(
            f"there is no master key at {path}; "
            "is GPULEASE_HOME (or GPULEASE_MASTER_KEY_FILE) the server's?",
            2,
        )
    engine = make_engine(settings.db_url)
    started = time.monotonic()
    try:
        done = rotate(make_sessionmaker(engine), path)
    except GpuleaseError as exc:
        out.fail(exc.message)
    except SQLAlchemyError as exc:
        out.fail(f"cannot use the database: {exc.__cause__ or exc}")
    finally:
        engine.dispose()
    out.console().print(
        f"rotated the master key {done.old_key_id} -> {done.new_key_id}: re-wrapped "
        f"{done.rewrapped} keys in {time.monotonic() - started:.1f} s. The new key is in "
        f"{path}; back it up now (apart from the database). Database backups made before "
        "this need the old key, which is gone.",
        markup=False,
        soft_wrap=True,
    )
