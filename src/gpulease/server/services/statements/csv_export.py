"""Statements and revenue as CSV: one row per line, exact micro-credits beside credits."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from datetime import date

from gpulease.core.money import SECONDS_PER_HOUR, format_credits
from gpulease.schemas.statements import RevenueLine, RevenuePublic, StatementLine, StatementPublic

Line = StatementLine | RevenueLine

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


def _cell(line: Line, column: str) -> object:
    """A column is the line's attribute of that name (a day as an ISO date), but for two
    derived ones: gpu_hours from gpu_seconds, and NAME beside NAME_micro, the same amount in
    credits with all six decimals and no currency symbol."""
    if column == "gpu_hours":
        return f"{line.gpu_seconds / SECONDS_PER_HOUR:.4f}"
    if hasattr(line, f"{column}_micro"):
        return format_credits(getattr(line, f"{column}_micro"), "", 6)
    value = getattr(line, column)
    return value.isoformat() if isinstance(value, date) else value


def _csv(columns: tuple[str, ...], lines: Iterable[Line]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    for line in lines:
        writer.writerow(
            ["" if cell is None else cell for cell in (_cell(line, c) for c in columns)]
        )
    return out.getvalue()


def statement_csv(statement: StatementPublic) -> str:
    """The statement's lines, one per day × wallet × instance × kind; amounts in credits
    with all six decimals (no currency symbol) beside the exact micro-credits."""
    return _csv(STATEMENT_COLUMNS, statement.lines)


def revenue_csv(report: RevenuePublic) -> str:
    return _csv(REVENUE_COLUMNS, report.lines)
