"""The time a request happens at, as a dependency: routes take `now: Now` instead of reading
the real clock, so a test pins it with `app.dependency_overrides[request_time]`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import Depends

from gpulease.server.db import utcnow


def request_time() -> datetime:
    """The real time (UTC), read once per request."""
    return utcnow()


Now = Annotated[datetime, Depends(request_time)]
