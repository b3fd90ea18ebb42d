"""Wire models for plans, off-peak windows, vouchers, spending limits and teams."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field, field_validator


class OffPeakCreate(BaseModel):
    weekdays: str = Field(default="all", max_length=40, description="mon-fri, sat,sun, all")
    start: str = Field(max_length=5, description="HH:MM local time")
    end: str = Field(max_length=5, description="HH:MM local time; before start = past midnight")
    discount: str = Field(max_length=8, description="percent, e.g. '40' or '40%'")


class OffPeakPublic(BaseModel):
    id: int
    weekdays: list[str]
    start: str
    end: str
    discount_percent: str
    tz: str


class VoucherCreate(BaseModel):
    amount: str = Field(max_length=40)
    code: str | None = Field(default=None, max_length=64)
    expires_at: datetime | None = None
    max_redemptions: int = 1
    per_user_limit: int = 1

    @field_validator("expires_at")
    @classmethod
    def _utc_unless_said(cls, value: datetime | None) -> datetime | None:
        """An expiry without a zone ('2026-12-31T23:59') is UTC."""
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class VoucherPublic(BaseModel):
    id: int
    code: str
    amount_micro: int
    amount: str
    expires_at: datetime | None
    max_redemptions: int
    per_user_limit: int
    used: int


class VoucherRedeem(BaseModel):
    code: str = Field(max_length=64)


class LimitsUpdate(BaseModel):
    """Amounts as decimal strings; null removes a cap."""

    max_hourly: str | None = Field(default=None, max_length=40)
    monthly_budget: str | None = Field(default=None, max_length=40)
    low_balance: str | None = Field(default=None, max_length=40)


class AdminLimitsUpdate(BaseModel):
    max_hourly: str | None = Field(default=None, max_length=40)
    monthly_budget: str | None = Field(default=None, max_length=40)


class LimitsPublic(BaseModel):
    max_hourly_micro: int | None
    monthly_budget_micro: int | None
    admin_max_hourly_micro: int | None
    admin_monthly_budget_micro: int | None
    low_balance_micro: int | None
    effective_max_hourly_micro: int | None
    effective_monthly_budget_micro: int | None
    hourly_spend_micro: int
    month_spend_micro: int


class TeamCreate(BaseModel):
    name: str = Field(max_length=64)


class TeamMemberUpdate(BaseModel):
    monthly_limit: str | None = Field(default=None, max_length=40)


class TeamMemberPublic(BaseModel):
    user: str
    monthly_limit_micro: int | None
    month_spend_micro: int


class TeamPublic(BaseModel):
    name: str
    owner: str
    balance_micro: int
    balance: str
    members: list[TeamMemberPublic]


class PlanQuote(BaseModel):
    plan: str
    hourly_micro: int
    hourly: str
    hourly_ncu: str
    block_micro: int | None
    rules: str
