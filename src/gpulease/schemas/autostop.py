"""Wire models for automatic stop and start: idle rules, schedules, time zones."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from gpulease.schemas.base import Id, Model


class AutostopUpdate(BaseModel):
    """The whole automatic-stop setting of an instance (PUT: a field left out turns it off)."""

    idle_util_pct: float | None = Field(
        default=None, description="GPU utilisation % under which it counts as idle (default 5)"
    )
    idle_minutes: int | None = Field(default=None, description="stop after this long idle")
    max_runtime_minutes: int | None = Field(
        default=None, description="stop after running this long"
    )
    stop_after_run: Id | None = Field(default=None, description="stop when this run ends")


class AutostopPublic(BaseModel):
    instance_id: int
    idle_util_pct: float
    idle_minutes: int | None
    """What the owner set; None: not set."""
    idle_minutes_effective: int | None
    """What applies: the owner's setting under the operator's ceiling (None: no idle stop)."""
    idle_ceiling_minutes: int | None
    max_runtime_minutes: int | None
    stop_after_run: int | None
    last_activity_at: datetime | None
    idle_warned_at: datetime | None
    idle_stop_at: datetime | None
    """While warned: when the idle instance will be stopped."""
    max_runtime_stop_at: datetime | None


class ScheduleCreate(BaseModel):
    action: str = Field(max_length=8, description="start or stop")
    cron: str = Field(max_length=120, description='five fields, e.g. "0 9 * * 1-5"')
    timezone: str | None = Field(
        default=None, max_length=64, description="IANA zone; default: your time zone"
    )


class SchedulePublic(Model):
    id: int
    instance_id: int
    action: str
    cron: str
    timezone: str
    next_fire_at: datetime
    last_fired_at: datetime | None
    created_at: datetime


class TimezoneUpdate(BaseModel):
    timezone: str = Field(max_length=64, description="IANA name, e.g. Europe/Berlin")
