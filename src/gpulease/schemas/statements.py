"""Wire models for statements and revenue.

Amounts are signed from the wallet's side (charges negative) in lines and by_kind; `charged`
and `credited` are both positive.
"""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel


class UsageTotals(BaseModel):
    seconds: int
    gpu_seconds: int
    gpu_hours: float
    charged_micro: int
    charged: str
    credited_micro: int
    credited: str
    by_kind: dict[str, int]


class DayUsage(UsageTotals):
    day: date


class InstanceUsage(UsageTotals):
    instance_id: int
    name: str
    gpu_model: str
    gpu_count: int


class GpuModelUsage(UsageTotals):
    gpu_model: str


class KindTotal(BaseModel):
    kind: str
    transactions: int
    amount_micro: int
    amount: str


class StatementLine(BaseModel):
    day: date
    wallet: str
    instance_id: int | None
    instance: str | None
    gpu_model: str | None
    gpu_count: int
    kind: str
    seconds: int
    gpu_seconds: int
    amount_micro: int
    amount: str


class StatementPublic(BaseModel):
    user: str
    start: date
    end: date
    tz: str
    currency: str
    currency_symbol: str
    opening_balance_micro: int
    opening_balance: str
    closing_balance_micro: int
    closing_balance: str
    totals: UsageTotals
    by_kind: list[KindTotal]
    by_day: list[DayUsage]
    by_instance: list[InstanceUsage]
    by_gpu_model: list[GpuModelUsage]
    lines: list[StatementLine]


class RevenueTotals(BaseModel):
    gpu_seconds: int
    gpu_hours: float
    revenue_micro: int
    revenue: str
    by_kind: dict[str, int]


class RevenueDay(RevenueTotals):
    day: date


class RevenueModel(RevenueTotals):
    gpu_model: str | None


class RevenueModelDay(RevenueTotals):
    day: date
    gpu_model: str | None


class RevenueLine(BaseModel):
    day: date
    gpu_model: str | None
    kind: str
    gpu_seconds: int
    revenue_micro: int
    revenue: str


class RevenuePublic(BaseModel):
    start: date
    end: date
    tz: str
    currency: str
    currency_symbol: str
    totals: RevenueTotals
    by_gpu_model: list[RevenueModel]
    by_day: list[RevenueDay]
    """Every day of the period, empty ones too (a chart's x axis)."""
    by_model_day: list[RevenueModelDay]
    lines: list[RevenueLine]
