"""`gpulease estimate`, `gpulease statement` and `gpulease admin revenue` against the real app."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

from wired_cli import Cli

from gpulease.schemas.instances import InstanceCreate
from gpulease.server.db import transaction
from gpulease.server.services import metering


def test_estimate_prints_a_row_per_gpu_model_with_the_currency(cli: Cli) -> None:
    cli.login_as("ann")
    args = ["estimate", "--model", "resnet50", "--images", "100000", "--epochs", "30"]
    shown = cli(*args, "--image-size", "224")
    assert shown.exit_code == 0, shown.output
    out = shown.stdout
    assert "resnet50: 100,000 images × 30 epochs at 224×224, 1 GPU" in out
    a100 = next(line for line in out.splitlines() if "A100-80GB" in line)
    assert "2,470" in a100 and "0.338" in a100 and "20 min" in a100
    assert "0.0141" in a100 and "$0.3037" in a100 and "published" in a100
    assert "CPU (rough)" in out and "NCU" in out
    assert "1 NCU = one A100 for 24 hours" in shown.stderr
    data = json.loads(cli(*args, "-o", "json").stdout)
    assert {row["gpu_model"] for row in data["rows"]} >= {"T4", "A100-80GB", "H100-80GB", "CPU"}
    eight = cli(*args, "--gpus", "8")
    assert "A100-80GB × 8" in eight.stdout and "85% scaling efficiency" in eight.stdout
    bad = cli("estimate", "--model", "alexnet", "--images", "10", "--epochs", "1")
    assert bad.exit_code == 1 and "unknown model 'alexnet'" in bad.stderr
    assert "resnet18" in bad.stderr


def test_statement_and_revenue_as_table_json_and_csv(cli: Cli) -> None:
    ann = cli.login_as("ann")
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    cluster = cli.server.cluster
    cluster.start()
    cluster.wait_for(lambda: ann.instances.get("box").status == "running")
    with transaction(cli.server.rt.sessions) as session:
        seg = metering.open_segment_of(session, ann.instances.get("box").id)
        assert seg is not None
        seg.started_at -= timedelta(hours=1)
    ann.instances.stop("box")
    cluster.wait_for(lambda: ann.instances.get("box").status == "stopped")

    shown = cli("statement")
    assert shown.exit_code == 0, shown.output
    assert "by GPU model" in shown.stdout and "T4" in shown.stdout and "box" in shown.stdout
    assert "signup_credit" in shown.stdout
    data = json.loads(cli("statement", "-o", "json").stdout)
    (model,) = data["by_gpu_model"]
    assert model["gpu_model"] == "T4" and model["charged_micro"] >= 250_000
    rows = list(csv.DictReader(io.StringIO(cli("statement", "-o", "csv").stdout)))
    assert sum(int(r["amount_micro"]) for r in rows) == (
        data["closing_balance_micro"] - data["opening_balance_micro"]
    )
    bad = cli("statement", "--from", "2026-13-01")
    assert bad.exit_code == 1 and "from must be a date like" in bad.stderr

    refused = cli("admin", "revenue")
    assert refused.exit_code == 1 and "admin" in refused.stderr
    cli.login_as_admin()
    revenue = cli("admin", "revenue")
    assert revenue.exit_code == 0, revenue.output
    assert "by day and GPU model" in revenue.stdout and "T4" in revenue.stdout
    report = json.loads(cli("admin", "revenue", "-o", "json").stdout)
    assert report["totals"]["revenue_micro"] == model["charged_micro"]
    lines = list(csv.DictReader(io.StringIO(cli("admin", "revenue", "-o", "csv").stdout)))
    assert sum(int(r["revenue_micro"]) for r in lines) == model["charged_micro"]
