"""The ledger read as a bill: the meter's charges grouped per session and day, no zero lines."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import func, select

from factories import BrowserFactory, Caller, RunnerDouble, logged_in, make_running_instance
from gpulease.core.money import cost_for_seconds
from gpulease.core.periods import Period
from gpulease.server.db import transaction
from gpulease.server.orm import LedgerTransaction, User
from gpulease.server.runtime import Runtime
from gpulease.server.services import ledger, metering
from gpulease.server.services.statements.bill_lines import (
    SessionInfo,
    WalletRow,
    bill_lines,
    user_bill,
)

UTC_ZONE = ZoneInfo("UTC")
# 22:50 UTC the day before: a session of 2 h 20 min crosses midnight at its 70th minute
STARTED = datetime(2024, 2, 28, 22, 50, tzinfo=UTC)
BEFORE, AFTER = date(2024, 2, 28), date(2024, 2, 29)
MIDNIGHT = datetime(2024, 2, 29, tzinfo=UTC)


def _row(n: int, key: str, amount: int, at: datetime, memo: str = "m") -> WalletRow:
    return WalletRow(n, "usage", key, memo, 7, at, amount)


def test_charges_group_into_one_line_per_session_and_day_in_plain_words() -> None:
    info = SessionInfo("train", "A100-80GB", 1, "on_demand", STARTED, 8400)
    ticks = range(600, 8401, 600)  # a charge every ten minutes, stamped with the second it bills to
    rows = [
        _row(i, f"usage:3:{s}", -100, STARTED + timedelta(seconds=s)) for i, s in enumerate(ticks)
    ]
    rows.append(WalletRow(90, "grant", "grant:1", "welcome (by admin)", None, STARTED, 5_000_000))
    rows.append(WalletRow(91, "usage", "usage:3:9000", "nothing", 7, STARTED, 0))
    lines = bill_lines(rows, {3: info}, UTC_ZONE, "$")

    assert [(line.day, line.text) for line in lines] == [
        (AFTER, "train: A100-80GB × 1, on demand, 1 h 10 min"),
        (BEFORE, "train: A100-80GB × 1, on demand, 1 h 10 min"),
        (BEFORE, "welcome (by admin)"),
    ]
    # each charge counts on the day it was posted (the zero row on none)
    before_midnight = sum(1 for s in ticks if STARTED + timedelta(seconds=s) < MIDNIGHT)
    assert [line.entries for line in lines] == [len(ticks) - before_midnight, before_midnight, 1]
    assert lines[0].amount_micro == -100 * (len(ticks) - before_midnight)
    assert sum(line.amount_micro for line in lines) == sum(r.amount_micro for r in rows)
    assert all(line.amount_micro != 0 for line in lines)

    # the same session in Shanghai (UTC+8) is one local day: one line of 2 h 20 min
    (shanghai, _) = bill_lines(rows, {3: info}, ZoneInfo("Asia/Shanghai"), "$")
    assert shanghai.text == "train: A100-80GB × 1, on demand, 2 h 20 min"
    assert shanghai.entries == len(ticks)


def test_a_refund_that_cancels_its_charges_leaves_no_line_and_a_net_refund_says_so() -> None:
    info = SessionInfo("cpu-box", "", 0, "spot", STARTED, 60)
    charge = _row(1, "usage:4:120", -300, STARTED + timedelta(seconds=120))
    back = _row(2, "usage-refund:4:120:60", 300, STARTED + timedelta(seconds=200))
    assert bill_lines([charge, back], {4: info}, UTC_ZONE, "$") == []
    late = _row(3, "usage-refund:4:120:60", 150, STARTED + timedelta(days=1))
    (line, first) = bill_lines([charge, late], {4: info}, UTC_ZONE, "$")
    assert line.text == "refund: cpu-box: CPU only, spot, 0 s" and line.amount_micro == 150
    assert first.text == "cpu-box: CPU only, spot, 1 min" and first.amount_micro == -300


def test_the_billing_page_and_the_ledger_read_side_on_the_database(
    ann: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    browser: BrowserFactory,
) -> None:
    instance_id, _ = make_running_instance(ann, tick, runner_for, "across", gpu="A100-80GB:1")
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None
        seg.started_at = STARTED
        session.flush()
        for seconds in (1800, 4199, 8400):  # 23:20, 23:59:59, 01:10: one charge each
            metering.charge_segment(session, seg, STARTED + timedelta(seconds=seconds))
        user_id = session.scalar(select(User.id).where(User.name == "ann"))
        assert user_id is not None
        ledger.post(
            session,
            kind="adjustment",
            key="zero:1",
            legs=[(ledger.account_id(session, ledger.WALLET, user_id), 0)],
            memo="nothing moved",
            user_id=user_id,
            at=STARTED,
        )
        stored = session.scalar(select(func.count()).select_from(LedgerTransaction))
    period = Period(BEFORE, AFTER, UTC_ZONE)
    with transaction(rt.sessions) as session:
        lines = user_bill(session, user_id, period, "$")
        # reading changes nothing the ledger stores
        assert session.scalar(select(func.count()).select_from(LedgerTransaction)) == stored
    assert [(line.day, line.text, line.entries) for line in lines] == [
        (AFTER, "across: A100-80GB × 1, on demand, 1 h 10 min", 1),
        (BEFORE, "across: A100-80GB × 1, on demand, 1 h 10 min", 2),
    ]
    hourly = rt.catalog.get("A100-80GB").hourly_micro
    assert lines[0].amount_micro == -(
        cost_for_seconds(hourly, 8400) - cost_for_seconds(hourly, 4199)
    )
    assert lines[1].amount_micro == -cost_for_seconds(hourly, 4199)

    got = ann.get("/api/v1/bill", params={"from": str(BEFORE), "to": str(AFTER)})
    assert got.status_code == 200, got.text
    assert [(x["day"], x["text"], x["amount_micro"]) for x in got.json()] == [
        (str(line.day), line.text, line.amount_micro) for line in lines
    ]
    bad = ann.get("/api/v1/bill", params={"from": "31/12/2024"})
    assert bad.status_code == 422 and "(YYYY-MM-DD)" in bad.json()["detail"]

    client = logged_in(browser, "ann")
    page = client.get("/billing", params={"from": str(BEFORE), "to": str(AFTER)})
    assert page.status_code == 200
    assert page.text.count("across: A100-80GB × 1, on demand, 1 h 10 min") == 2
    assert "nothing moved" not in page.text
