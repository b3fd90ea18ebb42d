"""Vouchers: codes admins issue for credit; users redeem them into their own wallet.

A voucher has an amount, an optional expiry, a total number of uses and a per-user limit.
Each use takes the next ordinal under a unique (voucher, ordinal) constraint and posts a
ledger transaction keyed by it, so two redemptions racing for the last use get one credit
between them on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import re
import secrets
from datetime import date, datetime, time, timedelta, tzinfo
from typing import cast

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpulease.core.errors import Conflict, InvalidInput, NotFound
from gpulease.core.numbers import parse_whole
from gpulease.server.db import utcnow
from gpulease.server.orm import User, Voucher, VoucherRedemption
from gpulease.server.services import ledger
from gpulease.server.services.rows import insert

CODE_RE = re.compile(r"^[A-Z0-9][A-Z0-9-]{3,63}$")
MAX_USES = 1_000_000


def parse_use_limit(text: str, what: str) -> int:
    """A typed number of uses (total, or per user): a whole number from 1 to MAX_USES."""
    return parse_whole(text, what, 1, MAX_USES)


def parse_expiry(text: str, zone: tzinfo) -> datetime | None:
    """A typed date: the voucher works until the end of that day in zone; '' never expires."""
    text = text.strip()
    if not text:
        return None
    try:
        day = date.fromisoformat(text) if len(text) == 10 else None
    except ValueError:
        day = None
    if day is None:
        raise InvalidInput(f"the expiry must be a date like 2026-12-31, not {text!r}")
    return datetime.combine(day + timedelta(days=1), time(0), tzinfo=zone)


def create_voucher(
    session: Session,
    admin: User,
    *,
    amount_micro: int,
    code: str | None = None,
    expires_at: datetime | None = None,
    max_redemptions: int = 1,
    per_user_limit: int = 1,
) -> Voucher:
    if amount_micro <= 0 or amount_micro > ledger.MAX_GRANT_MICRO:
        raise InvalidInput("a voucher's amount must be positive and at most a billion credits")
    if not 1 <= max_redemptions <= MAX_USES:
        raise InvalidInput("max redemptions must be between 1 and 1,000,000")
    if not 1 <= per_user_limit <= max_redemptions:
        raise InvalidInput("the per-user limit must be between 1 and the max redemptions")
    if expires_at is not None and expires_at <= utcnow():
        raise InvalidInput("the expiry is in the past; give a future date")
    code = (code or "-".join(secrets.token_hex(2).upper() for _ in range(4))).strip().upper()
    if not CODE_RE.match(code):
        raise InvalidInput("a voucher code is 4-64 letters, digits and '-'")
    if session.scalar(select(Voucher.id).where(Voucher.code == code)):
        raise Conflict(f"a voucher {code} exists already")
    voucher = Voucher(
        code=code,
        amount_micro=amount_micro,
        expires_at=expires_at,
        max_redemptions=max_redemptions,
        per_user_limit=per_user_limit,
        created_by=admin.id,
        created_at=utcnow(),
    )
    return insert(session, voucher)


def list_vouchers(session: Session) -> list[tuple[Voucher, int]]:
    """Vouchers with how many times each was used."""
    used = (
        select(VoucherRedemption.voucher_id, func.count(VoucherRedemption.id).label("n"))
        .group_by(VoucherRedemption.voucher_id)
        .subquery()
    )
    rows = session.execute(
        select(Voucher, func.coalesce(used.c.n, 0))
        .outerjoin(used, used.c.voucher_id == Voucher.id)
        .order_by(Voucher.id)
    )
    return [(cast(Voucher, voucher), cast(int, n_used)) for voucher, n_used in rows]


def redeem(session: Session, user: User, code: str) -> int:
    """Credit the voucher's amount to user's wallet. Returns the amount."""
    voucher = session.scalar(select(Voucher).where(Voucher.code == code.strip().upper()))
    if voucher is None:
        raise NotFound("no such voucher code; check it for typos")
    if voucher.expires_at is not None and voucher.expires_at <= utcnow():
        raise Conflict(f"voucher {voucher.code} expired on {voucher.expires_at:%Y-%m-%d}")
    mine = session.scalar(
        select(func.count(VoucherRedemption.id)).where(
            VoucherRedemption.voucher_id == voucher.id, VoucherRedemption.user_id == user.id
        )
    )
    if (mine or 0) >= voucher.per_user_limit:
        raise Conflict(f"you have already redeemed voucher {voucher.code}")
    used = session.scalar(
        select(func.count(VoucherRedemption.id)).where(VoucherRedemption.voucher_id == voucher.id)
    )
    ordinal = (used or 0) + 1
    if ordinal > voucher.max_redemptions:
        raise Conflict(f"voucher {voucher.code} has been used up")
    try:
        with session.begin_nested():
            session.add(
                VoucherRedemption(
                    voucher_id=voucher.id, user_id=user.id, ordinal=ordinal, created_at=utcnow()
                )
            )
            session.flush()
            ledger.grant(
                session,
                user.id,
                voucher.amount_micro,
                kind="voucher",
                key=f"voucher:{voucher.id}:{ordinal}",
                memo=f"voucher {voucher.code}",
            )
    except IntegrityError:
        raise Conflict(
            f"voucher {voucher.code} was being redeemed by someone else at the same moment; "
            "try again"
        ) from None
    return voucher.amount_micro
