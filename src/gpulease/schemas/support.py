"""Wire models for support tickets."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from gpulease.schemas.base import Id


class SupportMessagePublic(BaseModel):
    id: int
    author: str
    author_is_admin: bool
    body: str
    log_excerpt: str | None
    created_at: datetime


class SupportTicketPublic(BaseModel):
    id: int
    owner: str
    subject: str
    status: str
    instance: str | None
    run_id: int | None
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None


class SupportTicketDetail(SupportTicketPublic):
    messages: list[SupportMessagePublic]


class SupportTicketCreate(BaseModel):
    # Missing texts default to "" so that the service's message (not a bare 422) answers.
    subject: str = Field(default="", max_length=1000)
    body: str = ""
    # The instance's name or id, and a run of yours; attach_log adds the run's last lines.
    instance: str | None = Field(default=None, max_length=64)
    run_id: Id | None = None
    attach_log: bool = False


class SupportReply(BaseModel):
    body: str = ""
