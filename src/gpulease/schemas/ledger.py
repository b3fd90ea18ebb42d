"""Wire models for balances, ledger lines, usage segments and grants."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from gpulease.schemas.base import Model


class Balance(BaseModel):
    balance_micro: int
    balance: str
    currency: str
    ncu: str


class LedgerLine(BaseModel):
    id: int
    kind: str
    memo: str
    amount_micro: int
    amount: str
    instance_id: int | None
    created_at: datetime


class UsageSegmentPublic(Model):
    id: int
    instance_id: int
    gpu_model: str
    gpu_count: int
    hourly_micro: int
    started_at: datetime
    ended_at: datetime | None
    billed_seconds: int
    charged_micro: int


class Usage(BaseModel):
    segments: list[UsageSegmentPublic]
    ledger: list[LedgerLine]


class GrantCreate(BaseModel):
    user: str | None = Field(default=None, max_length=64)
    team: str | None = Field(default=None, max_length=64, description="grant to a team wallet")
    amount: str = Field(max_length=40, description="credits, e.g. '25.00'")
    memo: str = Field(default="admin grant", max_length=200)
