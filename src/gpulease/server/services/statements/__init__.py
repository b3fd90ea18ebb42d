"""Statements: a user's GPU time and money for a period, and the operator's revenue.

GPU time comes from usage segments: the seconds a segment has been billed for
([started_at, started_at + billed_seconds)), split at midnight in the statement's time zone,
second by second (a second belongs to the day it starts in; see core.periods), so the days
add up to the segment exactly. Money comes from the ledger: each wallet entry on the day its
transaction was posted. The meter posts running charges every few seconds, so time and money
agree by day except for a charge that straddles midnight.
"""

from __future__ import annotations

from datetime import datetime

from gpulease.core.periods import MAX_DAYS, Period, split_by_day
from gpulease.core.periods import parse_period as parse_period_at
from gpulease.core.periods import parse_zone as zone
from gpulease.server.db import utcnow
from gpulease.server.services.statements.csv_export import (
    REVENUE_COLUMNS,
    STATEMENT_COLUMNS,
    revenue_csv,
    statement_csv,
)
from gpulease.server.services.statements.revenue_report import revenue
from gpulease.server.services.statements.segments import TIME_KIND
from gpulease.server.services.statements.user import PERSONAL, user_statement

__all__ = [
    "MAX_DAYS",
    "PERSONAL",
    "REVENUE_COLUMNS",
    "STATEMENT_COLUMNS",
    "TIME_KIND",
    "Period",
    "parse_period",
    "revenue",
    "revenue_csv",
    "split_by_day",
    "statement_csv",
    "user_statement",
    "zone",
]


def parse_period(
    start: str | None, end: str | None, tz: str | None = "UTC", *, now: datetime | None = None
) -> Period:
    """core.periods.parse_period at `now`, by default the server's current time."""
    return parse_period_at(start, end, tz, now=now or utcnow())
