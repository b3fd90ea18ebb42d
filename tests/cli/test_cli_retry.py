"""`gpulease run --retry N` and a task's `retry:`: a task whose instance fails under it runs
again on a new instance; one that ends on its own, with any exit code, does not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session
from wired_cli import Cli

from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Instance, Run
from gpulease.server.services import preemption
from gpulease.server.services.instances.states import FAILED, STOPPED, switch_status

REASON = "node gpu-a left the cluster"


Job = Callable[[dict[str, Any]], tuple[list[tuple[str, str]], int]]


def first_run_meets(
    cli: Cli, happen: Callable[[Session, Instance], object], first: list[str], later: str
) -> Job:
    """A job script: during the first run, happen(session, its instance) on the server,
    then it prints `first` and exits 0; every later run prints `later` and succeeds."""

    def job(run: dict[str, Any]) -> tuple[list[tuple[str, str]], int]:
        if len(cli.server.cluster.runs) > 1:
            return [("stdout", later)], 0
        with transaction(cli.server.rt.sessions) as session:
            row = session.get(Run, run["id"])
            assert row is not None
            happen(session, row.instance)
        return [("stdout", line) for line in first], 0

    return job


def fail_first_instance(cli: Cli) -> Job:
    """The first run's instance fails under it (as when its node dies, which ends its runs
    without an exit code: the exit its gone runner would send is refused)."""
    return first_run_meets(
        cli, lambda session, i: switch_status(session, i, FAILED, REASON), [], "done\n"
    )


def task_file(tmp_path: Path, retry: int) -> Path:
    task = tmp_path / "task.yaml"
    task.write_text(f"resources:\n  accelerators: T4:1\nretry: {retry}\nrun: python train.py\n")
    return task


def test_run_retries_after_its_instance_failed(cli: Cli) -> None:
    ann = cli.login_as("ann")
    cli.server.cluster.job = fail_first_instance(cli)
    cli.server.cluster.start()
    result = cli("run", "--gpu", "T4:1", "--retry", "2", "--", "python train.py")
    assert result.exit_code == 0, result.output
    assert result.stdout == "done\n"
    assert f"failed: {REASON}; running the task again on a new instance (2 retries left)" in (
        result.stderr
    )
    first, second = ann.instances.list(include_released=True)
    assert first.status_reason == REASON
    assert [r["command"] for r in cli.server.cluster.runs] == ["python train.py"] * 2
    assert first.id != second.id
    # the failed one is given back at once; the retry's own run releases it at its end
    cli.server.cluster.wait_for(
        lambda: [i.status for i in ann.instances.list(include_released=True)] == ["released"] * 2
    )


def test_without_retries_a_failed_instance_ends_the_run(cli: Cli) -> None:
    ann = cli.login_as("ann")
    cli.server.cluster.job = fail_first_instance(cli)
    cli.server.cluster.start()
    result = cli("run", "--gpu", "T4:1", "--", "python train.py")
    assert result.exit_code == 1
    assert REASON in result.stderr
    assert "running the task again" not in result.stderr
    assert len(ann.instances.list(include_released=True)) == 1


def test_a_task_that_exits_non_zero_is_not_retried(cli: Cli, tmp_path: Path) -> None:
    ann = cli.login_as("ann")
    task = task_file(tmp_path, retry=3)
    cli.server.cluster.job = lambda run: ([("stderr", "boom\n")], 3)
    cli.server.cluster.start()
    result = cli("run", str(task))
    assert result.exit_code == 3
    assert "running the task again" not in result.stderr
    assert len(ann.instances.list(include_released=True)) == 1


def test_a_task_files_retry_applies_and_the_option_overrides_it(cli: Cli, tmp_path: Path) -> None:
    ann = cli.login_as("ann")
    task = task_file(tmp_path, retry=1)
    cli.server.cluster.job = fail_first_instance(cli)
    cli.server.cluster.start()
    result = cli("run", str(task), "--retry", "0")
    assert result.exit_code == 1
    assert "running the task again" not in result.stderr

    cli.server.cluster.runs.clear()
    result = cli("run", str(task))
    assert result.exit_code == 0, result.output
    assert "(1 retry left)" in result.stderr
    assert len(ann.instances.list(include_released=True)) == 3


def test_retry_refusals(cli: Cli, tmp_path: Path) -> None:
    cli.login_as("ann")
    result = cli("run", "--gpu", "T4:1", "--retry", "11", "--", "true")
    assert result.exit_code == 2
    assert "--retry" in result.output
    task = tmp_path / "task.yaml"
    task.write_text("retry: many\nrun: echo hi\n")
    result = cli("run", str(task))
    assert result.exit_code == 2
    assert "retry must be a whole number from 0 to 10" in result.output


def test_run_follows_its_task_when_the_server_queues_the_instance_again(cli: Cli) -> None:
    ann = cli.login_as("ann")

    def node_leaves(session: Session, instance: Instance) -> None:  # as for a spot instance
        instance.preempted_at = utcnow()
        switch_status(session, instance, STOPPED, REASON)

    cli.server.cluster.job = first_run_meets(cli, node_leaves, [], "resumed\n")
    cli.server.cluster.start()
    result = cli("run", "--gpu", "T4:1", "--spot", "--", "python train.py")
    assert result.exit_code == 0, result.output
    assert result.stdout == "resumed\n"
    assert "is queued again" in result.stderr
    (instance,) = ann.instances.list(include_released=True)  # the same instance, not a new one
    first, again = cli.server.cluster.runs
    assert again["id"] > first["id"] and again["command"] == first["command"]
    cli.server.cluster.wait_for(lambda: ann.instances.get(instance.id).status == "released")


def test_run_follows_its_task_through_a_preemption(cli: Cli) -> None:
    ann = cli.login_as("ann")

    def preempted(session: Session, instance: Instance) -> None:
        assert preemption.preempt(session, instance, utcnow(), grace_s=30)

    # it checkpoints and exits in the grace, with a code
    cli.server.cluster.job = first_run_meets(cli, preempted, ["checkpointed\n"], "resumed\n")
    cli.server.cluster.start()
    result = cli("run", "--gpu", "T4:1", "--spot", "--", "python train.py")
    assert result.exit_code == 0, result.output
    assert result.stdout == "checkpointed\nresumed\n"
    assert "is queued again" in result.stderr
    assert len(ann.instances.list(include_released=True)) == 1
