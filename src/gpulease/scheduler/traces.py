"""Cluster traces as jobs: a CSV file read through a column mapping (which column holds the
submit time, the duration, the GPU count, the user), times as seconds or date-times."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpulease.core.errors import InvalidInput

FIELDS = ("submit", "duration", "gpus", "user")
OPTIONAL = ("team", "plan")
DEFAULT_COLUMNS = {
    "submit": "timestamp",
    "duration": "duration",
    "gpus": "num_gpus",
    "user": "user",
}


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    submit: float  # seconds from the first submission
    duration: float
    gpus: int
    user: str
    team: str | None = None
    plan: str = "on_demand"


def parse_columns(text: str | None) -> dict[str, str]:
    """`submit=timestamp,duration=duration,gpus=num_gpus,user=cluster` as a mapping."""
    columns = dict(DEFAULT_COLUMNS)
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise InvalidInput(
                f"bad column mapping {part!r}: write FIELD=COLUMN, e.g. gpus=num_gpus"
            )
        if key not in FIELDS + OPTIONAL:
            raise InvalidInput(
                f"unknown field {key!r} in the column mapping; fields are "
                f"{', '.join(FIELDS + OPTIONAL)}"
            )
        columns[key] = value
    return columns


def _seconds(text: str, what: str, line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.strip())
        except ValueError:
            raise InvalidInput(
                f"line {line}: {what} {text!r} is neither seconds nor a date-time"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    if not math.isfinite(value):
        raise InvalidInput(f"line {line}: {what} {text!r} is not a finite number")
    return value


def read_jobs(rows: Iterable[Mapping[str, str]], columns: Mapping[str, str]) -> list[Job]:
    """Jobs in submit order, submit times from 0. Rows without GPUs are skipped."""
    raw: list[tuple[float, float, int, str, str | None, str]] = []
    for line, row in enumerate(rows, start=2):
        if not any((v or "").strip() for v in row.values()):
            continue
        cells = {}
        for field in FIELDS + OPTIONAL:
            name = columns.get(field)
            if name is None:
                continue
            value = row.get(name)
            if value is None or not value.strip():
                if field in OPTIONAL:
                    continue
                raise InvalidInput(f"line {line}: no value in column {name!r} ({field})")
            cells[field] = value.strip()
        submit = _seconds(cells["submit"], "submit time", line)
        try:
            duration = float(cells["duration"])
            gpus = int(float(cells["gpus"]))
        except ValueError:
            raise InvalidInput(
                f"line {line}: duration {cells['duration']!r} and GPU count {cells['gpus']!r} "
                "must be numbers"
            ) from None
        if not math.isfinite(duration) or duration < 0:
            raise InvalidInput(f"line {line}: duration {cells['duration']!r} must be ≥ 0")
        if gpus <= 0:
            continue
        raw.append(
            (
                submit,
                duration,
                gpus,
                cells["user"],
                cells.get("team"),
                cells.get("plan", "on_demand"),
            )
        )
    if not raw:
        raise InvalidInput("the trace has no jobs (no row with a GPU count above 0)")
    raw.sort(key=lambda r: r[0])
    first = raw[0][0]
    return [
        Job(i, submit - first, duration, gpus, user, team, plan)
        for i, (submit, duration, gpus, user, team, plan) in enumerate(raw)
    ]


def load_trace(path: Path, columns: Mapping[str, str]) -> list[Job]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [f"{columns[f]} ({f})" for f in FIELDS if columns.get(f) not in header] + [
            f"{columns[f]} ({f})" for f in OPTIONAL if f in columns and columns[f] not in header
        ]
        if missing:
            raise InvalidInput(
                f"{path} has no column {', '.join(missing)}; its columns are "
                f"{', '.join(header) or 'none'}: map them with --columns, e.g. "
                "--columns submit=timestamp,duration=duration,gpus=num_gpus,user=cluster"
            )
        return read_jobs(reader, columns)
