"""Wallets: balance, usage, plans, off-peak windows, vouchers, spending caps, teams."""

from __future__ import annotations

from gpulease.client.base import Resource, path_part
from gpulease.client.statements import Day, period_params
from gpulease.schemas.bill import BillLinePublic
from gpulease.schemas.billing import (
    LimitsPublic,
    LimitsUpdate,
    OffPeakPublic,
    PlanQuote,
    TeamCreate,
    TeamMemberUpdate,
    TeamPublic,
    VoucherRedeem,
)
from gpulease.schemas.ledger import Balance, Usage


class BillingAPI(Resource):
    """`client.billing`: what you have, what you spent, what it costs."""

    def balance(self, *, team: str | None = None) -> Balance:
        """Your wallet's balance, or team `team`'s."""
        params = {"team": team} if team is not None else None
        return self._api.one(Balance, "GET", "/balance", params=params)

    def usage(self) -> Usage:
        """Usage segments (what was billed, per GPU interval) and the ledger lines."""
        return self._api.one(Usage, "GET", "/usage")

    def bill(
        self, start: Day = None, end: Day = None, *, tz: str | None = None
    ) -> list[BillLinePublic]:
        """Your wallet from `start` to `end` (default: this month) as bill lines, newest
        first: the meter's charges one line per instance session and day, in words."""
        return self._api.many(BillLinePublic, "/bill", params=period_params(start, end, tz))

    def plans(self, gpu: str) -> list[PlanQuote]:
        """Each plan's price for `gpu` ("A100-80GB:2") and the rules shown before buying."""
        return self._api.many(PlanQuote, "/plans", params={"gpu": gpu})

    def offpeak(self) -> list[OffPeakPublic]:
        """The off-peak windows: when GPUs cost less."""
        return self._api.many(OffPeakPublic, "/offpeak")

    def redeem(self, body: VoucherRedeem) -> Balance:
        return self._api.one(Balance, "POST", "/vouchers/redeem", body=body)

    def limits(self) -> LimitsPublic:
        return self._api.one(LimitsPublic, "GET", "/limits")

    def set_limits(self, body: LimitsUpdate) -> LimitsPublic:
        """Your caps as decimal strings; a cap left out or None is removed."""
        return self._api.one(LimitsPublic, "PUT", "/limits", body=body)


class TeamsAPI(Resource):
    """`client.teams`: shared wallets and their members' monthly limits."""

    def create(self, body: TeamCreate) -> TeamPublic:
        return self._api.one(TeamPublic, "POST", "/teams", body=body)

    def list(self) -> list[TeamPublic]:
        return self._api.many(TeamPublic, "/teams")

    def get(self, name: str) -> TeamPublic:
        return self._api.one(TeamPublic, "GET", f"/teams/{path_part(name)}")

    def set_member(self, team: str, user: str, body: TeamMemberUpdate) -> TeamPublic:
        path = f"/teams/{path_part(team)}/members/{path_part(user)}"
        return self._api.one(TeamPublic, "PUT", path, body=body)

    def remove_member(self, team: str, user: str) -> None:
        self._api.send("DELETE", f"/teams/{path_part(team)}/members/{path_part(user)}")
