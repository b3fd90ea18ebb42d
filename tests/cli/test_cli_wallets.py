"""CLI plans, vouchers, caps, teams and off-peak windows against the in-process server."""

from __future__ import annotations

import json

from wired_cli import Cli

from gpulease.core.money import format_credits


def test_plans_and_daily_rules_before_purchase(cli: Cli) -> None:
    cli.login_as("ann")
    quotes = {q["plan"]: q for q in json.loads(cli("plans", "A100-80GB:1", "-o", "json").stdout)}
    assert quotes["daily"]["block_micro"] == 18_000_000
    # every amount in the server's one format, its currency symbol included
    assert format_credits(18_000_000) in cli("plans", "A100-80GB:1").stdout
    declined = cli("instance", "create", "--gpu", "T4:1", "--plan", "daily", input="n\n")
    assert declined.exit_code == 1
    assert "not refunded" in declined.stderr and "not created" in declined.stderr
    accepted = cli("instance", "create", "--gpu", "T4:1", "--plan", "daily", "--yes", "-o", "json")
    assert accepted.exit_code == 0, accepted.output
    assert json.loads(accepted.stdout)["plan"] == "daily"
    bad = cli("instance", "create", "--gpu", "T4:1", "--plan", "weekly")
    assert bad.exit_code == 1 and "unknown plan" in bad.stderr


def test_vouchers_limits_and_offpeak(cli: Cli) -> None:
    cli.login_as_admin()
    made = cli("admin", "voucher-create", "5.00", "--code", "HELLO-2026", "-o", "json")
    assert made.exit_code == 0, made.output
    assert cli("admin", "offpeak-add", "00:00", "08:00", "40").exit_code == 0
    overlap = cli("admin", "offpeak-add", "07:00", "09:00", "10", "--days", "mon")
    assert overlap.exit_code == 1 and "overlaps" in overlap.stderr
    cli.login_as("ann")
    assert "40%" in cli("offpeak").stdout
    redeemed = cli("voucher", "redeem", "HELLO-2026")
    assert redeemed.exit_code == 0 and "$15.0000" in redeemed.stdout
    again = cli("voucher", "redeem", "HELLO-2026")
    assert again.exit_code == 1 and "already redeemed" in again.stderr
    capped = cli("limits", "set", "--max-hourly", "1.00", "-o", "json")
    assert json.loads(capped.stdout)["effective_max_hourly_micro"] == 1_000_000
    assert format_credits(1_000_000) in cli("limits", "show").stdout
    over = cli("instance", "create", "--gpu", "A100-80GB:2")
    assert over.exit_code == 1 and "above your cap" in over.stderr
    negative = cli("limits", "set", "--monthly-budget", "-3")
    assert negative.exit_code == 1 and "negative" in negative.stderr


def test_teams(cli: Cli) -> None:
    cli.login_as("ann")
    assert cli("team", "create", "lab").exit_code == 0
    added = cli("team", "add", "lab", "bob", "--monthly-limit", "5", "-o", "json")
    assert added.exit_code == 0, added.output
    assert {m["user"] for m in json.loads(added.stdout)["members"]} == {"ann", "bob"}
    cli.login_as_admin()
    assert cli("admin", "grant-team", "lab", "12").exit_code == 0
    cli.login_as("bob")
    shown = cli("team", "show", "lab")
    assert "$12.0000" in shown.stdout
    refused = cli("team", "add", "lab", "bob", "--monthly-limit", "500")
    assert refused.exit_code == 1 and "owner" in refused.stderr
    made = cli("instance", "create", "--gpu", "T4:1", "--team", "lab", "-o", "json")
    assert made.exit_code == 0 and json.loads(made.stdout)["team"] == "lab"
