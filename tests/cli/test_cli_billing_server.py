"""CLI balance, usage and admin commands; and `gpulease server` start-up without serving."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner
from wired_cli import Cli

from gpulease.cli.main import app
from gpulease.core.money import format_credits
from gpulease.schemas.instances import InstanceCreate
from gpulease.server.db import transaction
from gpulease.server.services import metering


def test_balance_and_usage(cli: Cli) -> None:
    cli.login_as("ann")
    balance = cli("balance")
    assert "$10.0000 USD" in balance.stdout
    assert json.loads(cli("balance", "-o", "json").stdout)["balance_micro"] == 10_000_000

    usage = cli("usage")
    assert usage.exit_code == 0, usage.output
    assert "bill this month, in USD" in usage.stdout and "sign-up credit" in usage.stdout
    assert "credited $10.0000 this month; balance now $10.0000 USD" in usage.stdout


def test_usage_names_the_session_and_its_time_in_words(cli: Cli) -> None:
    ann = cli.login_as("ann")
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    for _ in range(50):
        cli.server.cluster.step()
        if ann.instances.get("box").status == "running":
            break
    # 2 h 14 min on one day, as the meter bills it: the day before yesterday (UTC), so
    # that the sign-up credit is on another day even when the test runs across midnight
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    start = midnight - timedelta(days=1, hours=3)
    with transaction(cli.server.rt.sessions) as session:
        segment = metering.open_segment_of(session, ann.instances.get("box").id)
        assert segment is not None
        before = segment.charged_micro
        segment.started_at = start
        session.flush()
        metering.charge_segment(session, segment, start + timedelta(seconds=8040.5))
        charged = segment.charged_micro - before
    assert charged > 0
    day = str(start.date())

    usage = cli("usage", "--from", day, "--to", day, "--tz", "UTC")
    assert usage.exit_code == 0, usage.output
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in usage.stdout.splitlines()]
    assert [day, "box: T4 × 1, on demand, 2 h 14 min", format_credits(-charged)] in cells
    assert "bill in this period, in USD" in usage.stdout
    assert f"charged {format_credits(charged)}, credited $0.0000 in this period" in usage.stdout
    data = json.loads(cli("usage", "--from", day, "--to", day, "-o", "json").stdout)
    (line,) = data["bill"]
    assert line["amount_micro"] == -charged and line["text"].startswith("box: T4 × 1")
    assert len(data["segments"]) == 1 and data["ledger"][-1]["kind"] == "signup_credit"

    cli.login_as("bob")  # another renter's bill has none of ann's sessions
    theirs = cli("usage", "--from", day, "--to", day, "--tz", "UTC")
    assert "box" not in theirs.output and "nothing billed or credited" in theirs.output
    bad = cli("usage", "--from", "yesterday")
    assert bad.exit_code == 1 and "YYYY-MM-DD" in bad.stderr, bad.output


def test_admin_grant_and_users(cli: Cli) -> None:
    ann = cli.login_as("ann")
    refused = cli("admin", "users")
    assert refused.exit_code == 1 and "admin" in refused.stderr

    cli.login_as_admin()
    granted = cli("admin", "grant", "ann", "25.00", "--memo", "course credit")
    assert granted.exit_code == 0, granted.output
    assert "granted $25.0000 to ann" in granted.stdout
    assert ann.billing.balance().balance_micro == 35_000_000
    assert ann.billing.usage().ledger[0].memo == "course credit (by admin)"
    line = json.loads(cli("admin", "grant", "ann", "0.5", "-o", "json").stdout)
    assert line["amount_micro"] == 500_000

    bad = cli("admin", "grant", "ann", "lots")
    assert bad.exit_code == 1 and "not an amount" in bad.stderr
    nobody = cli("admin", "grant", "nobody", "1")
    assert nobody.exit_code == 1 and bad.stderr.startswith("error: ")
    users = cli("admin", "users")
    assert "ann" in users.stdout and "admin" in users.stdout
    names = {u["name"] for u in json.loads(cli("admin", "users", "-o", "json").stdout)}
    assert names == {"admin", "ann", "bob"}


def test_server_prints_a_banner_and_the_first_admin_password_once(
    served: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULEASE_SIMULATED_GPUS", "A100-80GB:2")
    first = CliRunner().invoke(app, ["server", "--port", "9123"])
    assert first.exit_code == 0, first.output
    assert "http://127.0.0.1:9123" in first.stdout
    assert str(tmp_path / "home") in first.stdout
    assert "SQLite" in first.stdout
    assert "box: 2× A100-80GB (simulated)" in first.stdout
    assert "password" in first.stdout
    assert served == [
        {
            "host": "127.0.0.1",
            "port": 9123,
            "log_level": "warning",
            "access_log": False,
            "timeout_graceful_shutdown": 5,
        }
    ]

    again = CliRunner().invoke(app, ["server", "--host", "0.0.0.0"])
    assert again.exit_code == 0
    assert "password" not in again.stdout
    assert served[-1]["host"] == "0.0.0.0" and served[-1]["port"] == 8420


def _waiting_runners(runners_dir: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile, or not a process
        if b"--warm" in argv and f"{runners_dir}/".encode() in argv:
            found.append(int(entry.name))
    return found


def test_the_runner_kept_waiting_ends_with_the_server(
    served: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The server keeps one runner process waiting for the next launch; when it stops
    serving, that runner is told to exit (its pipe closed and the process reaped)."""
    result = CliRunner().invoke(app, ["server"])
    assert result.exit_code == 0, result.output
    assert len(served) == 1
    assert _waiting_runners(tmp_path / "home" / "runners") == []


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GPULEASE_PORT": "eighty"}, "GPULEASE_PORT"),
        (
            {"GPULEASE_ENVIRONMENT": "production", "GPULEASE_ADMIN_PASSWORD": "admin"},
            "GPULEASE_ADMIN_PASSWORD is weak",
        ),
    ],
)
def test_server_refuses_invalid_settings_without_a_traceback(
    served: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(app, ["server"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: invalid settings")
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert served == []
