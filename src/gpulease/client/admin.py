"""Operator actions (admins only): users, credit grants, off-peak windows, vouchers, caps."""

from __future__ import annotations

from gpulease.client.base import Resource, path_part
from gpulease.schemas.accounts import UserPublic
from gpulease.schemas.billing import (
    AdminLimitsUpdate,
    LimitsPublic,
    OffPeakCreate,
    OffPeakPublic,
    VoucherCreate,
    VoucherPublic,
)
from gpulease.schemas.ledger import GrantCreate, LedgerLine
from gpulease.schemas.quotas import QuotaPublic, QuotaUpdate


class AdminAPI(Resource):
    """`client.admin`: what only an admin account may do."""

    def users(self) -> list[UserPublic]:
        return self._api.many(UserPublic, "/admin/users")

    def grant(self, body: GrantCreate) -> LedgerLine:
        """Give a user (or a team's wallet) credit; the amount is a decimal string
        ("25.00"), never a float."""
        return self._api.one(LedgerLine, "POST", "/admin/grants", body=body)

    def add_offpeak(self, body: OffPeakCreate) -> OffPeakPublic:
        return self._api.one(OffPeakPublic, "POST", "/admin/offpeak", body=body)

    def remove_offpeak(self, window_id: int) -> None:
        self._api.send("DELETE", f"/admin/offpeak/{int(window_id)}")

    def create_voucher(self, body: VoucherCreate) -> VoucherPublic:
        return self._api.one(VoucherPublic, "POST", "/admin/vouchers", body=body)

    def vouchers(self) -> list[VoucherPublic]:
        return self._api.many(VoucherPublic, "/admin/vouchers")

    def set_limits(self, user: str, body: AdminLimitsUpdate) -> LimitsPublic:
        path = f"/admin/users/{path_part(user)}/limits"
        return self._api.one(LimitsPublic, "PUT", path, body=body)

    def quotas(self) -> list[QuotaPublic]:
        """The GPU caps set on users and teams."""
        return self._api.many(QuotaPublic, "/admin/quotas")

    def set_quota(self, kind: str, name: str, max_gpus: int | None) -> QuotaPublic:
        """Cap the GPUs user or team (`kind`) `name` may hold at once; None lifts it."""
        path = f"/admin/quotas/{path_part(kind)}s/{path_part(name)}"
        return self._api.one(QuotaPublic, "PUT", path, body=QuotaUpdate(max_gpus=max_gpus))
