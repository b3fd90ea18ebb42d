"""Wire model of the ledger read as a bill: one line per instance session and day."""

from __future__ import annotations

from datetime import date, datetime

from gpulease.schemas.base import Model


class BillLinePublic(Model):
    """A line of the bill: the meter's charges of one session on one day summed (its time
    in plain words), or one other movement (a grant, a voucher, a daily block)."""

    day: date
    kind: str
    text: str
    amount_micro: int
    amount: str
    instance_id: int | None
    entries: int
    last_at: datetime
