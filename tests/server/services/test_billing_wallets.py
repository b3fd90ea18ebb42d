"""Vouchers, spending caps, teams, storage, low balance and auto-release: through the API."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import select

from factories import Caller, RunnerDouble, make_user
from gpulease.server import db
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Instance, StorageMeter
from gpulease.server.reconcilers import billing
from gpulease.server.runtime import Runtime
from gpulease.server.services import metering


def _balance(caller: Caller, team: str | None = None) -> int:
    params = {"team": team} if team else None
    return int(caller.get("/api/v1/balance", params=params).json()["balance_micro"])


def test_vouchers_single_use_expiry_and_limits(ann: Caller, bob: Caller, admin: Caller) -> None:
    r = admin.post("/api/v1/admin/vouchers", json={"amount": "5", "code": "WELCOME-5"})
    assert r.status_code == 201, r.text
    assert ann.post("/api/v1/admin/vouchers", json={"amount": "5"}).status_code == 403
    r = ann.post("/api/v1/vouchers/redeem", json={"code": "welcome-5"})
    assert r.status_code == 200 and r.json()["balance_micro"] == 15_000_000
    r = bob.post("/api/v1/vouchers/redeem", json={"code": "WELCOME-5"})
    assert r.status_code == 409 and "used up" in r.json()["detail"]
    assert _balance(bob) == 10_000_000

    admin.post(
        "/api/v1/admin/vouchers", json={"amount": "1", "code": "CLASS-2026", "max_redemptions": 10}
    )
    assert ann.post("/api/v1/vouchers/redeem", json={"code": "CLASS-2026"}).status_code == 200
    r = ann.post("/api/v1/vouchers/redeem", json={"code": "CLASS-2026"})
    assert r.status_code == 409 and "already redeemed" in r.json()["detail"]
    assert bob.post("/api/v1/vouchers/redeem", json={"code": "CLASS-2026"}).status_code == 200
    used = {v["code"]: v["used"] for v in admin.get("/api/v1/admin/vouchers").json()}
    assert used == {"WELCOME-5": 1, "CLASS-2026": 2}

    assert ann.post("/api/v1/vouchers/redeem", json={"code": "NOPE-0000"}).status_code == 404


def test_voucher_bad_input(admin: Caller, ann: Caller, rt: Runtime) -> None:
    past = (utcnow() - timedelta(days=1)).isoformat()
    cases = [
        ({"amount": "-5"}, "cannot be negative"),
        ({"amount": "0"}, "positive"),
        ({"amount": "1e30"}, "billion"),
        ({"amount": "5", "expires_at": past}, "past"),
        ({"amount": "5", "max_redemptions": 0}, "max redemptions"),
        ({"amount": "5", "per_user_limit": 3}, "per-user limit"),
        ({"amount": "5", "code": "a b"}, "code"),
    ]
    for body, words in cases:
        r = admin.post("/api/v1/admin/vouchers", json=body)
        assert r.status_code == 422 and words in r.json()["detail"], (body, r.text)
    admin.post("/api/v1/admin/vouchers", json={"amount": "5", "code": "SOON-GONE"})
    from gpulease.server.orm import Voucher

    with transaction(rt.sessions) as session:
        voucher = session.scalars(select(Voucher)).one()
        voucher.expires_at = utcnow() - timedelta(seconds=1)
    r = ann.post("/api/v1/vouchers/redeem", json={"code": "SOON-GONE"})
    assert r.status_code == 409 and "expired" in r.json()["detail"]
    assert _balance(ann) == 10_000_000


def test_caps_refuse_starts_with_the_numbers(
    ann: Caller, admin: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    r = ann.put("/api/v1/limits", json={"max_hourly": "1.00"})
    assert r.status_code == 200 and r.json()["effective_max_hourly_micro"] == 1_000_000
    assert ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1"}).status_code == 201
    r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1"})
    assert r.status_code == 402
    assert "$1.8000/h" in r.json()["detail"] and "$1.0000/h" in r.json()["detail"]
    # a cap below the current spend is refused
    r = ann.put("/api/v1/limits", json={"max_hourly": "0.50"})
    assert r.status_code == 422 and "below what your live instances cost" in r.json()["detail"]
    # admin ceiling
    r = admin.put("/api/v1/admin/users/ann/limits", json={"max_hourly": "1.20"})
    assert r.status_code == 200, r.text
    r = ann.put("/api/v1/limits", json={"max_hourly": "5.00"})
    assert r.status_code == 422 and "an admin caps" in r.json()["detail"]
    assert ann.put("/api/v1/admin/users/ann/limits", json={"max_hourly": "9"}).status_code == 403
    for bad in ("-1", "abc", "1e30"):
        assert ann.put("/api/v1/limits", json={"monthly_budget": bad}).status_code == 422
    assert ann.get("/api/v1/limits").json()["monthly_budget_micro"] is None


def test_monthly_budget_stops_instances(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    assert ann.put("/api/v1/limits", json={"monthly_budget": "1.00"}).status_code == 200
    r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1"})
    instance_id = r.json()["id"]
    tick()
    runner_for(instance_id).ready()
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None
        seg.started_at -= timedelta(hours=2)
        metering.charge_segment(session, seg, utcnow())
    billing.budgets(rt)
    got = ann.get(f"/api/v1/instances/{instance_id}").json()
    assert got["status"] == "stopping" and "monthly budget" in got["status_reason"]
    r = ann.post("/api/v1/instances", json={"gpu": "T4:1"})
    assert r.status_code == 402 and "monthly budget" in r.json()["detail"]


def test_teams_share_a_wallet_with_member_limits(
    http,
    ann: Caller,
    bob: Caller,
    admin: Caller,
    rt: Runtime,  # type: ignore[no-untyped-def]
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    assert ann.post("/api/v1/teams", json={"name": "vision-lab"}).status_code == 201
    assert ann.post("/api/v1/teams", json={"name": "vision-lab"}).status_code == 409
    assert (
        admin.post("/api/v1/admin/grants", json={"team": "vision-lab", "amount": "20"}).status_code
        == 201
    )
    assert _balance(ann, "vision-lab") == 20_000_000
    # bob is not a member yet: he cannot see it or charge it
    assert bob.get("/api/v1/teams/vision-lab").status_code == 404
    r = bob.post("/api/v1/instances", json={"gpu": "T4:1", "team": "vision-lab"})
    assert r.status_code == 404
    r = ann.put("/api/v1/teams/vision-lab/members/bob", json={"monthly_limit": "0.50"})
    assert r.status_code == 200, r.text
    # a member cannot manage members
    assert (
        bob.put("/api/v1/teams/vision-lab/members/bob", json={"monthly_limit": "99"}).status_code
        == 403
    )
    r = bob.post("/api/v1/instances", json={"gpu": "T4:1", "team": "vision-lab"})
    assert r.status_code == 201, r.text
    instance_id = r.json()["id"]
    assert r.json()["team"] == "vision-lab"
    tick()
    runner_for(instance_id).ready()
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None and seg.team_id is not None
        seg.started_at -= timedelta(hours=3)
        metering.charge_segment(session, seg, utcnow())
    assert _balance(bob) == 10_000_000  # his own wallet untouched
    assert _balance(ann, "vision-lab") == 20_000_000 - 750_000
    team = ann.get("/api/v1/teams/vision-lab").json()
    spent = {m["user"]: m["month_spend_micro"] for m in team["members"]}
    assert spent == {"ann": 0, "bob": 750_000}
    assert [m["user"] for m in bob.get("/api/v1/teams/vision-lab").json()["members"]] == ["bob"]
    billing.budgets(rt)  # bob is past his 0.50 limit
    got = bob.get(f"/api/v1/instances/{instance_id}").json()
    assert got["status"] == "stopping" and "limit on the team wallet" in got["status_reason"]
    r = bob.post("/api/v1/instances", json={"gpu": "A100-80GB:1", "team": "vision-lab"})
    assert r.status_code == 402 and "ask the team's owner" in r.json()["detail"]
    assert ann.delete("/api/v1/teams/vision-lab/members/ann").status_code == 422
    assert ann.delete("/api/v1/teams/vision-lab/members/bob").status_code == 204


def test_workspace_storage_is_billed_per_gb_day(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    rt.backend.same_host = True  # as on the local backend: the workspace is on this disk
    r = ann.post("/api/v1/instances", json={"gpu": "T4:1", "name": "box"})
    instance_id = r.json()["id"]
    workspace = rt.settings.workspaces_path / str(instance_id)
    workspace.mkdir(parents=True)
    (workspace / "weights.bin").write_bytes(b"\0" * (4 * 1024 * 1024))
    billing.storage_tick(rt)  # first measurement
    with transaction(rt.sessions) as session:
        meter = session.scalars(select(StorageMeter)).one()
        kib = meter.kib
        assert 4096 <= kib <= 4096 + 64
        meter.measured_at -= timedelta(days=10)  # ten days pass
    billing.storage_tick(rt)
    with transaction(rt.sessions) as session:
        meter = session.scalars(select(StorageMeter)).one()
        expected = kib * 10 * 86_400 * 3_000 // (1024 * 1024 * 86_400)
        assert meter.charged_micro == expected > 0
    usage = ann.get("/api/v1/usage").json()["ledger"]
    assert -sum(line["amount_micro"] for line in usage if line["kind"] == "storage") == expected


def test_stopped_instances_are_released_after_warnings(
    ann: Caller, rt: Runtime, tick: Callable[[], None]
) -> None:
    instance_id = ann.post("/api/v1/instances", json={"gpu": "T4:1", "name": "old"}).json()["id"]
    ann.post("/api/v1/instances/old/stop")
    with transaction(rt.sessions) as session:
        row = session.get(Instance, instance_id)
        assert row is not None and row.stopped_at is not None
        row.stopped_at -= timedelta(days=13)
    billing.release_stopped(rt)
    billing.release_stopped(rt)  # a notice goes out once
    notes = [n["message"] for n in ann.get("/api/v1/notifications").json()]
    assert sum("will be released" in n for n in notes) == 1
    assert ann.get("/api/v1/instances/old").json()["status"] == "stopped"
    with transaction(rt.sessions) as session:
        row = session.get(Instance, instance_id)
        assert row is not None and row.stopped_at is not None
        row.stopped_at -= timedelta(days=3)
    billing.release_stopped(rt)
    assert ann.get("/api/v1/instances/old").json()["status"] == "released"


def test_a_release_pass_over_more_instances_than_one_in_list_releases_every_one(
    ann: Caller, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stopped instances pile up over months: the ids due are taken again a slice at a time
    # (PostgreSQL refuses more than 65,535 parameters a statement), here slices of 2.
    monkeypatch.setattr(db, "IN_BATCH", 2)
    names = [f"old{n}" for n in range(5)]
    for name in names:
        assert ann.post("/api/v1/instances", json={"gpu": None, "name": name}).is_success
        assert ann.post(f"/api/v1/instances/{name}/stop").is_success
    with transaction(rt.sessions) as session:
        for row in session.scalars(select(Instance).where(Instance.name.in_(names))):
            assert row.stopped_at is not None
            row.stopped_at -= timedelta(days=30)
    billing.release_stopped(rt)
    assert {ann.get(f"/api/v1/instances/{name}").json()["status"] for name in names} == {"released"}


def test_low_balance_warns_once(
    http,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],  # type: ignore[no-untyped-def]
) -> None:
    cid = make_user(http, "cid")
    r = cid.post("/api/v1/instances", json={"gpu": "A100-80GB:2"})
    instance_id = r.json()["id"]
    tick()
    runner_for(instance_id).ready()
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None
        seg.started_at -= timedelta(hours=5)  # $9.00 of $10.00 spent, 33 min left at $1.80/h
        metering.charge_segment(session, seg, utcnow())
    billing.budgets(rt)
    billing.budgets(rt)
    notes = [n["message"] for n in cid.get("/api/v1/notifications").json()]
    assert sum(n.startswith("low balance") for n in notes) == 1


def test_dataset_storage_is_billed_once_per_stored_chunk(
    ann: Caller, rt: Runtime, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    from datasets_support import sdk, write_tree

    data = b"x" * (3 * 1024 * 1024)
    tree = write_tree(tmp_path / "cats", {"a.bin": data, "copy/a.bin": data})  # stored once
    sdk(ann).datasets.push(tree, "cats")
    billing.dataset_storage(rt)
    with transaction(rt.sessions) as session:
        meter = session.scalars(select(StorageMeter).where(StorageMeter.kind == "datasets")).one()
        assert meter.kib == 3 * 1024
        meter.measured_at -= timedelta(days=30)
    billing.dataset_storage(rt)
    expected = 3 * 1024 * 30 * 86_400 * 3_000 // (1024 * 1024 * 86_400)  # 3 MiB for 30 days
    ledger = ann.get("/api/v1/usage").json()["ledger"]
    assert -sum(line["amount_micro"] for line in ledger if line["kind"] == "storage") == expected
