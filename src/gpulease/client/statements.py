"""Statements (your usage over a period) and revenue (admins), as models or CSV text."""

from __future__ import annotations

from datetime import date

from gpulease.client.base import Params, Resource
from gpulease.schemas.statements import RevenuePublic, StatementPublic

Day = date | str | None
"""A day of a period (a date or YYYY-MM-DD); None: the default end of the period."""


def period_params(start: Day, end: Day, tz: str | None) -> Params:
    """A period as the query of the server's period reports (from, to, tz)."""
    return {
        key: str(value)
        for key, value in (("from", start), ("to", end), ("tz", tz))
        if value is not None
    }


class StatementsAPI(Resource):
    """`client.statements`. Periods run from `start` to `end` (dates, both included;
    default: this month in the operator's time zone, or `tz`)."""

    def get(self, start: Day = None, end: Day = None, *, tz: str | None = None) -> StatementPublic:
        """Your usage by instance, day, GPU model and kind."""
        params = period_params(start, end, tz)
        return self._api.one(StatementPublic, "GET", "/statement", params=params)

    def csv(self, start: Day = None, end: Day = None, *, tz: str | None = None) -> str:
        """The statement's lines as CSV text (what `gpulease statement -o csv` prints)."""
        return self._api.csv("/statement.csv", period_params(start, end, tz))

    def revenue(
        self, start: Day = None, end: Day = None, *, tz: str | None = None
    ) -> RevenuePublic:
        """Revenue and GPU-hours sold per GPU model per day (admins only)."""
        params = period_params(start, end, tz)
        return self._api.one(RevenuePublic, "GET", "/admin/revenue", params=params)

    def revenue_csv(self, start: Day = None, end: Day = None, *, tz: str | None = None) -> str:
        return self._api.csv("/admin/revenue.csv", period_params(start, end, tz))
