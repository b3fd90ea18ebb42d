"""Shared base for wire models that are built from attributes."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from gpulease.core.ids import MAX_BIGINT, MAX_ID

# An id in a request body: a larger one is invalid input (a 422), not an overflow inside the
# database driver.
Id = Annotated[int, Field(ge=1, le=MAX_ID)]
# A count or size that a database column stores (BIGINT).
Count = Annotated[int, Field(ge=0, le=MAX_BIGINT)]


class Model(BaseModel):
    model_config = ConfigDict(from_attributes=True)
