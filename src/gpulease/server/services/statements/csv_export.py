"""Statements and revenue as CSV: one row per line, exact micro-credits beside credits."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable

from gpulease.core.money import SECONDS_PER_HOUR, format_credits
from gpulease.schemas.statements import RevenuePublic, StatementPublic

STATEMENT_COLUMNS = (
    "day",
    "wallet",
    "instance_id",
    "instance",
    "gpu_model",
    "gpu_count",
    "kind",
    "seconds",
    "gpu_seconds",
    "gpu_hours",
    "amount_micro",
    "amount",
)
REVENUE_COLUMNS = (
    "day",
    "gpu_model",
    "kind",
    "gpu_seconds",
    "gpu_hours",
    "revenue_micro",
    "revenue",
)


def _csv(columns: tuple[str, ...], rows: Iterable[tuple[object, ...]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if cell is None else cell for cell in row])
    return out.getvalue()


def _hours(gpu_seconds: int) -> str:
    return f"{gpu_seconds / SECONDS_PER_HOUR:.4f}"


def statement_csv(statement: StatementPublic) -> str:
    """The statement's lines, one per day × wallet × instance × kind; amounts in credits
    with all six decimals (no currency symbol) beside the exact micro-credits."""
    return _csv(
        STATEMENT_COLUMNS,
        (
            (
                line.day.isoformat(),
                line.wallet,
                line.instance_id,
                line.instance,
                line.gpu_model,
                line.gpu_count,
                line.kind,
                line.seconds,
                line.gpu_seconds,
                _hours(line.gpu_seconds),
                line.amount_micro,
                format_credits(line.amount_micro, "", 6),
            )
            for line in statement.lines
        ),
    )


def revenue_csv(report: RevenuePublic) -> str:
    return _csv(
        REVENUE_COLUMNS,
        (
            (
                line.day.isoformat(),
                line.gpu_model,
                line.kind,
                line.gpu_seconds,
                _hours(line.gpu_seconds),
                line.revenue_micro,
                format_credits(line.revenue_micro, "", 6),
            )
            for line in report.lines
        ),
    )
