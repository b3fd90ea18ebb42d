"""GPU quotas (admin): the most GPUs a user's or a team's instances may hold at once."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

MAX_QUOTA = 100_000  # GPUs: more than any fleet, so that a typo is refused, not stored


class QuotaUpdate(BaseModel):
    max_gpus: int | None = Field(ge=0, le=MAX_QUOTA)  # None: no cap


class QuotaPublic(BaseModel):
    kind: Literal["user", "team"]
    name: str
    max_gpus: int | None
