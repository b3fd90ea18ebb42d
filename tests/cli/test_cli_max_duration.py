"""gpulease run --max-duration and a task's max_duration: the instance's maximum runtime."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from wired_cli import Cli

from gpulease.server.db import transaction
from gpulease.server.orm import Instance


def runtimes(cli: Cli) -> list[int | None]:
    with transaction(cli.server.rt.sessions) as session:
        return list(session.scalars(select(Instance.max_runtime_minutes).order_by(Instance.id)))


def test_run_sets_the_declared_duration_from_the_task_or_the_option(
    cli: Cli, tmp_path: Path
) -> None:
    cli.login_as("ann")
    task = tmp_path / "task.yaml"
    task.write_text("name: train\nmax_duration: 90m\nrun: python train.py\n")
    cli.server.cluster.start()
    assert cli("run", str(task)).exit_code == 0
    assert cli("run", str(task), "--max-duration", "2h").exit_code == 0
    assert runtimes(cli) == [90, 120]

    bad = cli("run", str(task), "--max-duration", "soon")
    assert bad.exit_code == 2 and "--max-duration 'soon' is not a length of time" in bad.stderr
    task.write_text("max_duration: 120\nrun: python train.py\n")
    unitless = cli("run", str(task))
    assert unitless.exit_code == 2 and "write it with units, e.g. 2h" in unitless.stderr
    assert len(runtimes(cli)) == 2  # refused before renting anything
