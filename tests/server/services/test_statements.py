"""Statements and revenue: GPU time split by day, money to the micro-credit, privacy, CSV."""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import func, select

from factories import Caller, RunnerDouble, make_running_instance
from gpulease.core.errors import InvalidInput
from gpulease.core.money import cost_for_seconds
from gpulease.server.db import transaction
from gpulease.server.orm import LedgerAccount, LedgerEntry, LedgerTransaction, UsageSegment, User
from gpulease.server.runtime import Runtime
from gpulease.server.services import ledger, metering, statements

Tick = Callable[[], None]
Runners = Callable[[int], RunnerDouble]


def _bill_from(rt: Runtime, instance_id: int, start: datetime, seconds: int) -> None:
    """Move the open segment's start to `start` and bill it for `seconds`, as the meter does."""
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None
        seg.started_at = start
        session.flush()
        metering.charge_segment(session, seg, start + timedelta(seconds=seconds, milliseconds=500))
        assert seg.billed_seconds == seconds


@functools.cache
def _midnight_utc() -> datetime:
    """The last midnight UTC, read once: the tests place their segments around it, and a run
    that crosses midnight must not see two different days."""
    return datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _usage_of(rt: Runtime, user_name: str) -> int:
    """What a user's wallet was charged for usage, straight from the ledger."""
    with transaction(rt.sessions) as session:
        user_id = session.scalar(select(User.id).where(User.name == user_name))
        total = session.scalar(
            select(func.coalesce(func.sum(LedgerEntry.amount), 0))
            .join(LedgerTransaction, LedgerTransaction.id == LedgerEntry.transaction_id)
            .join(LedgerAccount, LedgerAccount.id == LedgerEntry.account_id)
            .where(
                LedgerAccount.kind == ledger.WALLET,
                LedgerAccount.user_id == user_id,
                LedgerTransaction.kind == "usage",
            )
        )
        return -int(total or 0)


def _period(days_back: int = 1) -> dict[str, str]:
    today = _midnight_utc().date()
    return {"from": str(today - timedelta(days=days_back)), "to": str(today)}


def test_gpu_time_splits_at_midnight_in_the_statements_zone(
    ann: Caller, rt: Runtime, tick: Tick, runner_for: Runners
) -> None:
    instance_id, _ = make_running_instance(ann, tick, runner_for, "across", gpu="A100-80GB:2")
    midnight = _midnight_utc()
    # 1 h 30 min before midnight (and a quarter second, to test the partial second), 4 h long
    _bill_from(rt, instance_id, midnight - timedelta(seconds=5400 - 0.25), 4 * 3600)
    today, yesterday = midnight.date(), midnight.date() - timedelta(days=1)

    got = ann.get("/api/v1/statement", params=_period()).json()
    days = {d["day"]: d for d in got["by_day"]}
    # seconds 0..5399 start before midnight, the 9000 others after it; two GPUs each
    assert days[str(yesterday)]["seconds"] == 5400
    assert days[str(yesterday)]["gpu_seconds"] == 2 * 5400
    assert days[str(today)]["seconds"] == 9000
    assert days[str(today)]["gpu_seconds"] == 2 * 9000
    assert got["totals"]["gpu_seconds"] == 2 * 4 * 3600
    assert got["totals"]["gpu_hours"] == 8.0
    (inst,) = got["by_instance"]
    assert inst["name"] == "across" and inst["gpu_seconds"] == 2 * 4 * 3600
    # the charge was posted now: money is on the day it was posted
    assert inst["charged_micro"] == cost_for_seconds(1_800_000, 4 * 3600) == 7_200_000
    assert days[str(today)]["charged_micro"] == 7_200_000

    # Shanghai is UTC+8: the whole interval (06:30–10:30 there) falls on one local day
    local = ann.get("/api/v1/statement", params={**_period(), "tz": "Asia/Shanghai"}).json()
    assert local["tz"] == "Asia/Shanghai"
    shanghai_day = midnight.astimezone(ZoneInfo("Asia/Shanghai")).date()
    (usage_day,) = [d for d in local["by_day"] if d["gpu_seconds"]]
    assert usage_day["day"] == str(shanghai_day) and usage_day["seconds"] == 4 * 3600

    # a period that ends before midnight sees only the first part
    before = ann.get(
        "/api/v1/statement", params={"from": str(yesterday), "to": str(yesterday)}
    ).json()
    assert before["totals"]["seconds"] == 5400 and before["totals"]["charged_micro"] == 0


def test_split_by_day_is_exact_for_any_start() -> None:
    period = statements.parse_period("2026-03-28", "2026-03-31", "Europe/Berlin")
    # 2026-03-29 is 23 hours long in Berlin (clocks go forward at 02:00). The segment starts
    # a microsecond before midnight there: its first second belongs to the 28th.
    start = datetime(2026, 3, 28, 22, 59, 59, 999_999, tzinfo=UTC)
    split = statements.split_by_day(period, start, 2 * 86400)
    assert split == {
        date(2026, 3, 28): 1,
        date(2026, 3, 29): 23 * 3600,
        date(2026, 3, 30): 24 * 3600,
        date(2026, 3, 31): 2 * 86400 - 1 - 47 * 3600,
    }
    # outside the period: nothing; running past its end: cut at the end
    assert statements.split_by_day(period, start - timedelta(days=10), 3600) == {}
    tail = statements.split_by_day(period, datetime(2026, 3, 31, 21, 0, tzinfo=UTC), 7200)
    assert tail == {date(2026, 3, 31): 3600}


def test_per_model_and_per_instance_totals_equal_the_ledger(
    ann: Caller, rt: Runtime, tick: Tick, runner_for: Runners
) -> None:
    t4, _ = make_running_instance(ann, tick, runner_for, "small", gpu="T4:1")
    _bill_from(rt, t4, _midnight_utc() - timedelta(seconds=1234), 7777)
    a100, _ = make_running_instance(ann, tick, runner_for, "big", gpu="A100-80GB:1")
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, a100)
        assert seg is not None
        seg.started_at -= timedelta(seconds=1001)
    ann.post(f"/api/v1/instances/{a100}/stop")
    runner_for(a100).stopped()  # closes and bills the segment to the second

    got = ann.get("/api/v1/statement", params=_period()).json()
    with transaction(rt.sessions) as session:
        segs = {s.instance_id: s for s in session.scalars(select(UsageSegment))}
    by_model = {m["gpu_model"]: m for m in got["by_gpu_model"]}
    assert by_model["T4"]["charged_micro"] == segs[t4].charged_micro
    assert by_model["A100-80GB"]["charged_micro"] == segs[a100].charged_micro
    assert by_model["A100-80GB"]["gpu_seconds"] == segs[a100].billed_seconds
    assert sum(m["charged_micro"] for m in got["by_gpu_model"]) == _usage_of(rt, "ann")
    assert sum(i["charged_micro"] for i in got["by_instance"]) == _usage_of(rt, "ann")
    assert got["totals"]["charged_micro"] == _usage_of(rt, "ann")
    kinds = {k["kind"]: k for k in got["by_kind"]}
    assert kinds["usage"]["amount_micro"] == -_usage_of(rt, "ann")
    assert kinds["signup_credit"]["amount_micro"] == 10_000_000
    assert got["opening_balance_micro"] == 0
    balance = ann.get("/api/v1/balance").json()["balance_micro"]
    assert got["closing_balance_micro"] == balance == 10_000_000 - _usage_of(rt, "ann")
    assert got["currency_symbol"] == "$" and got["totals"]["charged"].startswith("$")


def test_csv_parses_and_matches_the_json(
    ann: Caller, rt: Runtime, tick: Tick, runner_for: Runners
) -> None:
    instance_id, _ = make_running_instance(ann, tick, runner_for, "csv-box", gpu="T4:1")
    _bill_from(rt, instance_id, _midnight_utc() - timedelta(seconds=600), 1200)
    data = ann.get("/api/v1/statement", params=_period()).json()
    r = ann.get("/api/v1/statement.csv", params=_period())
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/csv")
    disposition = r.headers["content-disposition"]
    assert disposition.startswith("attachment;") and "gpulease-statement-ann-" in disposition
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == len(data["lines"]) >= 3  # sign-up credit, two days of usage
    for row, line in zip(rows, data["lines"], strict=True):
        assert row["day"] == line["day"] and row["kind"] == line["kind"]
        assert row["wallet"] == line["wallet"]
        assert row["instance"] == (line["instance"] or "")
        assert int(row["gpu_seconds"]) == line["gpu_seconds"]
        assert int(row["amount_micro"]) == line["amount_micro"]
        assert row["amount"] == f"{line['amount_micro'] / 1_000_000:.6f}"
    assert sum(int(row["amount_micro"]) for row in rows) == (
        data["closing_balance_micro"] - data["opening_balance_micro"]
    )


def test_another_users_figures_never_show(
    ann: Caller, bob: Caller, rt: Runtime, tick: Tick, runner_for: Runners
) -> None:
    instance_id, _ = make_running_instance(
        ann, tick, runner_for, "secret-project", gpu="A100-80GB:1"
    )
    _bill_from(rt, instance_id, _midnight_utc() - timedelta(seconds=100), 200)
    mine = bob.get("/api/v1/statement", params=_period()).json()
    assert mine["user"] == "bob"
    assert mine["by_instance"] == [] and mine["by_gpu_model"] == []
    assert mine["totals"]["gpu_seconds"] == 0 and mine["totals"]["charged_micro"] == 0
    assert [line["kind"] for line in mine["lines"]] == ["signup_credit"]
    # there is no way to name another user: unknown parameters change nothing
    also = bob.get("/api/v1/statement", params={**_period(), "user": "ann", "user_id": 1})
    assert also.json() == mine
    text = bob.get("/api/v1/statement.csv", params={**_period(), "user": "ann"}).text
    assert "secret-project" not in text and "A100" not in text
    assert "secret-project" in ann.get("/api/v1/statement.csv", params=_period()).text
    assert bob.get("/api/v1/statement").status_code == 200
    assert ann.http.get("/api/v1/statement").status_code == 401


def test_admin_revenue_is_the_sum_of_everyones_usage(
    ann: Caller, bob: Caller, admin: Caller, rt: Runtime, tick: Tick, runner_for: Runners
) -> None:
    midnight = _midnight_utc()
    a, _ = make_running_instance(ann, tick, runner_for, "a", gpu="A100-80GB:1")
    b, _ = make_running_instance(
        bob, tick, runner_for, "b", gpu="T4:1"
    )  # (its tick bills a too: start both first)
    _bill_from(rt, a, midnight - timedelta(seconds=3600), 7200)
    _bill_from(rt, b, midnight + timedelta(seconds=60), 999)

    got = admin.get("/api/v1/admin/revenue", params=_period()).json()
    usage = _usage_of(rt, "ann") + _usage_of(rt, "bob")
    assert got["totals"]["revenue_micro"] == usage
    assert got["totals"]["gpu_seconds"] == 7200 + 999
    models = {m["gpu_model"]: m for m in got["by_gpu_model"]}
    assert models["A100-80GB"]["revenue_micro"] == _usage_of(rt, "ann")
    assert models["T4"]["revenue_micro"] == _usage_of(rt, "bob")
    assert models["T4"]["gpu_seconds"] == 999
    # every day of the period, for the chart; GPU time sold split at midnight
    assert [d["day"] for d in got["by_day"]] == [
        str(midnight.date() - timedelta(days=1)),
        str(midnight.date()),
    ]
    cells = {(c["day"], c["gpu_model"]): c for c in got["by_model_day"]}
    assert cells[(str(midnight.date() - timedelta(days=1)), "A100-80GB")]["gpu_seconds"] == 3600
    assert cells[(str(midnight.date()), "A100-80GB")]["gpu_seconds"] == 3600
    assert sum(c["revenue_micro"] for c in got["by_model_day"]) == usage

    r = admin.get("/api/v1/admin/revenue.csv", params=_period())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert sum(int(row["revenue_micro"]) for row in rows) == usage
    assert [(row["day"], row["gpu_model"], row["kind"]) for row in rows] == [
        (line["day"], line["gpu_model"] or "", line["kind"]) for line in got["lines"]
    ]

    for path in ("/api/v1/admin/revenue", "/api/v1/admin/revenue.csv"):
        refused = ann.get(path, params=_period())
        assert refused.status_code == 403 and "admin" in refused.json()["detail"]
    assert ann.get("/api/v1/admin/revenue", params={"from": "bad"}).status_code == 403


BAD_PERIODS = [
    ({"from": "2026-13-01"}, "from must be a date like"),
    ({"to": "yesterday"}, "to must be a date like"),
    ({"from": "2026-02-30"}, "from must be a date like"),
    ({"from": "2026-11-30", "to": "2026-11-01"}, "is after to"),
    ({"from": "2024-01-01", "to": "2025-01-31"}, "at most 366 days"),
    ({"tz": "Mars/Olympus_Mons"}, "is not a time zone"),
]


def test_bad_periods_are_refused_with_a_reason(ann: Caller, admin: Caller) -> None:
    for params, says in BAD_PERIODS:
        for caller, path in ((ann, "/api/v1/statement"), (admin, "/api/v1/admin/revenue")):
            for suffix in ("", ".csv"):
                r = caller.get(path + suffix, params=params)
                assert r.status_code == 422, (params, r.text)
                assert says in r.json()["detail"]


def test_default_period_is_this_calendar_month() -> None:
    now = datetime(2026, 2, 14, 23, 30, tzinfo=UTC)
    p = statements.parse_period(None, None, "UTC", now=now)
    assert (p.start, p.end) == (date(2026, 2, 1), date(2026, 2, 28))
    # 16:00 UTC on 28 February is already 1 March in Tokyo
    p = statements.parse_period(None, None, "Asia/Tokyo", now=datetime(2026, 2, 28, 16, tzinfo=UTC))
    assert (p.start, p.end) == (date(2026, 3, 1), date(2026, 3, 31))
    p = statements.parse_period("2024-02-10", None, "UTC")
    assert (p.start, p.end) == (date(2024, 2, 10), date(2024, 2, 29))
    p = statements.parse_period(None, "2026-12-05", "UTC")
    assert (p.start, p.end) == (date(2026, 12, 1), date(2026, 12, 5))
    assert len(statements.parse_period("2024-01-01", "2024-12-31", "UTC").days()) == 366
    with pytest.raises(InvalidInput):
        statements.parse_period("2023-01-01", "2024-01-02", "UTC")  # 367 days
