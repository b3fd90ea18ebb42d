"""CLI exec, run, logs and runs: output streamed as the job wrote it, exit codes passed on."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from inprocess import tar_members
from wired_cli import Cli

from gpulease.cli import instances
from gpulease.client import ApiError
from gpulease.client.billing import BillingAPI
from gpulease.core.money import format_credits
from gpulease.schemas.instances import InstanceCreate
from gpulease.schemas.runs import RunCreate


def test_exec_streams_stdout_and_stderr_and_exits_with_the_code(cli: Cli) -> None:
    ann = cli.login_as("ann")
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    cli.server.cluster.job = lambda run: ([("stdout", "out 1\n"), ("stderr", "err 1\n")], 3)
    cli.server.cluster.start()
    result = cli("exec", "box", "--env", "LR=0.1", "--", "python", "train.py", "--note", "a b")
    assert result.exit_code == 3
    assert result.stdout == "out 1\n"
    assert "err 1\n" in result.stderr
    (run,) = cli.server.cluster.runs
    assert run["command"] == "python train.py --note 'a b'"
    assert run["env"] == {"LR": "0.1"}


def test_exec_passes_one_argument_as_a_shell_script(cli: Cli) -> None:
    ann = cli.login_as("ann")
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    cli.server.cluster.start()
    result = cli("exec", "box", "--", "cd data && ls | wc -l")
    assert result.exit_code == 0
    assert cli.server.cluster.runs[0]["command"] == "cd data && ls | wc -l"
    assert result.stdout == "running: cd data && ls | wc -l\n"


def test_exec_refusals(cli: Cli) -> None:
    ann = cli.login_as("ann")
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    ann.instances.stop("box")
    stopped = cli("exec", "box", "--", "true")
    assert stopped.exit_code == 1 and "start it first" in stopped.stderr
    bad_env = cli("exec", "box", "--env", "NOEQUALS", "--", "true")
    assert bad_env.exit_code == 2 and "KEY=VALUE" in bad_env.stderr


def test_exec_exits_1_and_says_why_when_the_instance_goes_away(cli: Cli) -> None:
    ann = cli.login_as("ann")
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    cli.server.cluster.hold = True  # the runner never gets ready: the run stays pending
    cli.server.cluster.start()

    def stop_once_the_run_is_queued() -> None:
        cli.server.cluster.wait_for(lambda: bool(ann.runs.list()))
        ann.instances.stop("box")

    stopper = threading.Thread(target=stop_once_the_run_is_queued)
    stopper.start()
    try:
        result = cli("exec", "box", "--", "sleep 100")
    finally:
        stopper.join()
    assert result.exit_code == 1
    assert re.search(r"error: run \d+ failed: stopped by its owner", result.stderr)


def start_the_cluster_on_the_first_wait(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the instance queued until the CLI has said what it waits for (its first poll)."""
    started: list[bool] = []

    def sleep(seconds: float) -> None:
        if not started:
            started.append(True)
            cli.server.cluster.start()
        time.sleep(seconds)

    monkeypatch.setattr(instances, "time", SimpleNamespace(sleep=sleep))


def test_exec_on_a_queued_instance_says_what_it_waits_for(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    ann = cli.login_as("ann")
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    start_the_cluster_on_the_first_wait(cli, monkeypatch)
    result = cli("exec", "box", "--", "echo hi")
    assert result.exit_code == 0, result.output
    assert "instance box: queued, being placed on a node" in result.stderr


def test_logs_follow_of_a_pending_run_says_what_it_waits_for(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    ann = cli.login_as("ann")
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    run = ann.runs.create("box", RunCreate(command="echo later"))
    start_the_cluster_on_the_first_wait(cli, monkeypatch)
    followed = cli("logs", str(run.id), "-f")
    assert followed.exit_code == 0, followed.output
    assert "instance box: queued, being placed on a node" in followed.stderr


def task_dir(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "code" / ".git").mkdir(parents=True)
    (project / "code" / "train.py").write_text("print('training')\n")
    (project / "code" / ".git" / "config").write_text("x")
    (project / "task.yaml").write_text(
        "name: Cat Breeds_v2!\n"
        "workdir: code\n"
        "resources:\n  accelerators: {T4: 1}\n"
        "envs:\n  EPOCHS: 3\n"
        "setup: pip list\n"
        "run: python train.py\n"
    )
    return project


def test_run_task_file_uploads_runs_streams_and_releases(cli: Cli, tmp_path: Path) -> None:
    ann = cli.login_as("ann")
    project = task_dir(tmp_path)
    cli.server.cluster.job = lambda run: ([("stdout", "epoch 1\n"), ("stdout", "done\n")], 0)
    cli.server.cluster.start()
    result = cli("run", str(project / "task.yaml"), "--env", "LR=0.5")
    assert result.exit_code == 0, result.output
    assert result.stdout == "epoch 1\ndone\n"

    (instance,) = ann.instances.list(include_released=True)
    assert re.fullmatch(r"cat-breeds-v2-[0-9a-f]{4}", instance.name)
    assert (instance.gpu_model, instance.gpu_count) == ("T4", 1)
    (run,) = cli.server.cluster.runs
    assert "exec bash -c 'pip list' setup)" in run["command"]
    assert run["command"].endswith("exec bash -c 'python train.py' run")
    assert run["env"] == {"EPOCHS": "3", "LR": "0.5"}
    members = tar_members(cli.server.cluster.workdirs[instance.id] or b"")
    assert members == {"train.py": b"print('training')\n"}
    # the task's name and its own command, not the wrapper; one closing line
    (listed,) = ann.runs.list()
    assert f"run {listed.id}, task 'Cat Breeds_v2!': python train.py" in result.stderr
    assert listed.task_name == "Cat Breeds_v2!"
    listing = cli("runs").stdout
    assert "python train.py" in listing and "CUDA_VISIBLE_DEVICES" not in listing
    assert "Cat Breeds_v2!" in listing, listing
    charged = sum(s.charged_micro for s in ann.billing.usage().segments)
    *_, last = result.stderr.strip().splitlines()
    assert re.fullmatch(
        rf"run {listed.id} succeeded in \d+ s, cost {re.escape(format_credits(charged))}; "
        rf"instance {instance.name} released",
        last,
    ), last
    # the run stopped its instance, and auto-release gives it back
    cli.server.cluster.wait_for(lambda: ann.instances.get(instance.id).status == "released")


def test_run_that_ends_between_two_polls_still_names_its_run_and_command(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow poller first sees the instance released: the run it made had started."""
    ann = cli.login_as("ann")
    project = task_dir(tmp_path)
    cli.server.cluster.job = lambda run: ([("stdout", "done\n")], 0)

    def sleep(seconds: float) -> None:
        if not cli.server.cluster.runs:
            cli.server.cluster.start()
            cli.server.cluster.wait_for(
                lambda: ann.instances.list(include_released=True)[0].status == "released"
            )

    monkeypatch.setattr(instances, "time", SimpleNamespace(sleep=sleep))
    result = cli("run", str(project / "task.yaml"))
    assert result.exit_code == 0, result.output
    (listed,) = ann.runs.list()
    assert f"run {listed.id}, task 'Cat Breeds_v2!': python train.py\n" in result.stderr
    assert "is running" not in result.stderr


def test_run_picks_among_skypilot_accelerators_and_warns_of_cloud_fields(
    cli: Cli, tmp_path: Path
) -> None:
    ann = cli.login_as("ann")
    free = {m.name: m.free for m in ann.catalog.gpus() if m.is_gpu and m.free}
    assert "T4" in free, free
    (tmp_path / "t.yaml").write_text(
        "resources:\n  cloud: aws\n  disk_size: 100\n  accelerators: {h100, t4}\nrun: echo hi\n"
    )
    cli.server.cluster.job = lambda run: ([("stdout", "hi\n")], 0)
    cli.server.cluster.start()
    result = cli("run", str(tmp_path / "t.yaml"))
    assert result.exit_code == 0, result.output
    assert (
        "ignored here" in result.stderr and "resources.cloud, resources.disk_size" in result.stderr
    )
    assert "accelerators h100:1, t4:1: T4:1 (free now" in result.stderr
    (instance,) = ann.instances.list(include_released=True)
    assert (instance.gpu_model, instance.gpu_count) == ("T4", 1)
    (tmp_path / "u.yaml").write_text("resources: {accelerators: 'L4:1'}\nrun: x\n")
    unknown = cli("run", str(tmp_path / "u.yaml"))
    assert unknown.exit_code == 2 and "L4:1: no such GPU here" in unknown.stderr


def test_run_command_form_without_workdir_and_exit_code(cli: Cli) -> None:
    ann = cli.login_as("ann")
    cli.server.cluster.job = lambda run: ([("stderr", "boom\n")], 7)
    cli.server.cluster.start()
    result = cli("run", "--gpu", "A100-80GB:1", "--env", "K=V", "--", "python", "-c", "x = 1")
    assert result.exit_code == 7
    assert "boom\n" in result.stderr
    (run,) = cli.server.cluster.runs
    assert (run["command"], run["env"]) == ("python -c 'x = 1'", {"K": "V"})
    (instance,) = ann.instances.list(include_released=True)
    assert cli.server.cluster.workdirs[instance.id] is None  # nothing uploaded
    assert instance.gpu_model == "A100-80GB"


def test_run_keeps_its_exit_code_when_its_cost_cannot_be_read(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli.login_as("ann")
    cli.server.cluster.job = lambda run: ([("stdout", "ok\n")], 3)
    cli.server.cluster.start()

    def refuse(self: BillingAPI) -> None:
        raise ApiError(503, "the usage service is down")

    monkeypatch.setattr(BillingAPI, "usage", refuse)
    result = cli("run", "--gpu", "T4:1", "--", "true")
    assert result.exit_code == 3
    assert "its cost could not be read: the usage service is down" in result.stderr


def test_run_with_workdir_option(cli: Cli, tmp_path: Path) -> None:
    cli.login_as("ann")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "a.py").write_text("1")
    cli.server.cluster.start()
    result = cli("run", "--gpu", "T4:1", "--workdir", str(tmp_path / "w"), "--", "python a.py")
    assert result.exit_code == 0, result.output
    (data,) = cli.server.cluster.workdirs.values()
    assert tar_members(data or b"") == {"a.py": b"1"}


def test_run_refuses_bad_tasks_before_renting_anything(cli: Cli, tmp_path: Path) -> None:
    ann = cli.login_as("ann")
    (tmp_path / "bad.yaml").write_text("run: x\nresources: {gpus: 2}\n")
    bad = cli("run", str(tmp_path / "bad.yaml"))
    assert bad.exit_code == 2 and "unknown resources field" in bad.stderr
    missing = cli("run", str(tmp_path / "missing.yaml"))
    assert missing.exit_code == 2 and "not found" in missing.stderr
    nothing = cli("run")
    assert nothing.exit_code == 2 and "gpulease run task.yaml" in nothing.stderr
    (tmp_path / "t.yaml").write_text("run: x\nworkdir: nope\n")
    no_workdir = cli("run", str(tmp_path / "t.yaml"))
    assert no_workdir.exit_code == 1 and "does not exist" in no_workdir.stderr
    assert ann.instances.list(include_released=True) == []


def test_run_interrupted_releases_its_instance(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    ann = cli.login_as("ann")
    cli.server.cluster.hold = True  # stays `starting`, so the CLI is waiting when ^C comes

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(instances, "time", SimpleNamespace(sleep=interrupt))
    cli.server.cluster.start()
    result = cli("run", "--gpu", "T4:1", "--", "sleep 1000")
    assert result.exit_code == 130
    assert "releasing instance" in result.stderr
    (instance,) = ann.instances.list(include_released=True)
    assert instance.desired_state == "released"
    cli.server.cluster.wait_for(lambda: ann.instances.get(instance.id).status == "released")


def test_run_on_an_instance_that_fails_to_start(cli: Cli) -> None:
    cli.login_as("ann")
    cli.server.backend.start_error = RuntimeError("no runner binary")
    cli.server.cluster.start()
    result = cli("run", "--gpu", "T4:1", "--", "true")
    assert result.exit_code == 1
    assert "no runner binary" in result.stderr


def test_logs_pages_follow_and_runs_listing(cli: Cli) -> None:
    ann = cli.login_as("ann")
    instance = ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    cli.server.cluster.job = lambda run: ([("stdout", f"line {i}\n") for i in range(3)], 0)
    run = ann.runs.create("box", RunCreate(command="python train.py\necho second line"))
    assert "pending: instance queued, being placed on a node" in cli("runs").stdout
    cli.server.cluster.start()
    followed = cli("logs", str(run.id), "-f")
    assert followed.exit_code == 0 and followed.stdout == "line 0\nline 1\nline 2\n"
    assert cli("logs", str(run.id)).stdout == "line 0\nline 1\nline 2\n"

    listed = cli("runs", "--instance", "box")
    assert "box" in listed.stdout and "python train.py…" in listed.stdout
    (row,) = json.loads(cli("runs", "--instance", str(instance.id), "-o", "json").stdout)
    assert (row["id"], row["status"], row["exit_code"]) == (run.id, "succeeded", 0)
    missing = cli("logs", "999")
    assert missing.exit_code == 1 and "no run 999" in missing.stderr


def test_run_picks_a_choice_whose_share_meets_cpus_and_memory(cli: Cli, tmp_path: Path) -> None:
    ann = cli.login_as("ann")
    models = {m.name: m for m in ann.catalog.gpus()}
    t4, a100 = models["T4"], models["A100-80GB"]
    assert t4.ram_gb_per_gpu is not None and a100.ram_gb_per_gpu is not None
    # more than one T4 comes with, less than two A100s do
    wanted = min(t4.ram_gb_per_gpu, a100.ram_gb_per_gpu) * 1.5
    (tmp_path / "t.yaml").write_text(
        f"resources:\n  memory: {wanted:.2f}+\n  accelerators: {{T4: 1, A100-80GB: 2}}\nrun: x\n"
    )
    cli.server.cluster.job = lambda run: ([], 0)
    cli.server.cluster.start()
    result = cli("run", str(tmp_path / "t.yaml"))
    assert result.exit_code == 0, result.output
    assert "T4:1, A100-80GB:2: A100-80GB:2 (free now" in result.stderr
    (tmp_path / "big.yaml").write_text(
        f"resources: {{memory: {wanted * 10:.0f}, accelerators: T4:1}}\nrun: x\n"
    )
    big = cli("run", str(tmp_path / "big.yaml"))
    assert big.exit_code == 2 and "but T4:1 comes with" in big.stderr
    assert "ask for more GPUs" in big.stderr
    (tmp_path / "cpu.yaml").write_text("resources: {cpus: 1000+}\nrun: x\n")
    cpu = cli("run", str(tmp_path / "cpu.yaml"))
    assert cpu.exit_code == 2 and "a CPU-only instance comes with" in cpu.stderr


def test_gpus_and_instance_show_tell_the_cpu_and_memory_share(cli: Cli) -> None:
    ann = cli.login_as("ann")
    t4 = next(m for m in ann.catalog.gpus() if m.name == "T4")
    assert t4.vcpus_per_gpu is not None and t4.vcpus_per_gpu > 0
    listing = cli("gpus")
    assert "CPU/RAM PER GPU" in listing.stdout and "GB RAM" in listing.stdout
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    shown = cli("instance", "show", "box")
    assert re.search(r"cpu and memory\s+[\d.]+ vCPU, [\d.]+ GB RAM", shown.stdout), shown.stdout
