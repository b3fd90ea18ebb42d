"""What `gpulease dataset push` prints when it is done, in one place: the Typer command
(cli/datasets.py) and the quick path of an unchanged push (cli/entry.py) print the same.
Imports nothing heavy: the quick path loads it."""

from __future__ import annotations

from typing import Any

from gpulease.core.datasets import format_bytes


def push_report(
    dataset: dict[str, Any],
    *,
    push_id: int | None,
    files: int,
    size: int,
    sent_chunks: int,
    sent_bytes: int,
    index_hits: int,
    unchanged: bool,
    seconds: float,
) -> dict[str, Any]:
    """The push's `-o json` answer; dataset as the server's JSON has it."""
    return {
        "dataset": dataset,
        "push_id": push_id,
        "files": files,
        "bytes": size,
        "sent_chunks": sent_chunks,
        "sent_bytes": sent_bytes,
        "index_hits": index_hits,
        "unchanged": unchanged,
        "seconds": round(seconds, 3),
    }


def unchanged_text(name: str, version: int | None, files: int, size: int, seconds: float) -> str:
    """The line of a push that found the tree to be the dataset's current version."""
    return (
        f"{name} v{version} already holds these {files:,} files ({format_bytes(size)}): "
        f"nothing to push ({seconds:.2f} s)"
    )
