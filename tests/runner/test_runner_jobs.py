"""A run's process: its environment, output capture, process-group stop and kill."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpulease.backends.base import RunnerSpec
from gpulease.backends.procfs import all_stats, read_stat
from gpulease.core.templates import get_template
from gpulease.runner.jobs import RunProcess, run_env, stop_runs
from gpulease.runner.logs import LogBatcher


def make_spec(tmp_path: Path, gpus: tuple[int, ...] = ()) -> RunnerSpec:
    return RunnerSpec(
        instance_id=42,
        server_url="http://127.0.0.1:1",
        token="secret-token",
        workspace=tmp_path,
        run_dir=tmp_path / "run",
        env_cache=tmp_path / "envs",
        template=get_template("python"),
        gpu_indices=gpus,
        extra_env={"FROM_INSTANCE": "1", "SHARED": "instance"},
    )


def test_run_env_fixes_what_the_protocol_says(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    base = {
        "PATH": "/usr/bin",
        "HOME": "/home/ann",
        "PYTHONPATH": "/server/src",
        "GPULEASE_DATABASE_URL": "postgresql://secret",
    }
    env = run_env(
        make_spec(tmp_path, gpus=(0, 2)),
        env_dir,
        7,
        {"SHARED": "run", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "GPULEASE_RUN_ID": "9"},
        base=base,
    )

    assert env["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["PATH"] == f"{env_dir / 'bin'}:/usr/bin"
    assert env["VIRTUAL_ENV"] == str(env_dir)
    assert env["GPULEASE_INSTANCE_ID"] == "42"
    assert env["GPULEASE_RUN_ID"] == "7"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["HOME"] == "/home/ann"
    assert env["FROM_INSTANCE"] == "1"
    assert env["SHARED"] == "run"
    assert "PYTHONPATH" not in env
    assert "GPULEASE_DATABASE_URL" not in env
    assert "secret-token" not in env.values()


def test_no_gpu_means_an_empty_cuda_visible_devices(tmp_path: Path) -> None:
    env = run_env(make_spec(tmp_path), tmp_path, 1, {}, base={})

    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_the_instance_layer_comes_before_the_template_venv(tmp_path: Path) -> None:
    layer, template = tmp_path / "ws" / ".gpulease" / "venv", tmp_path / "venv"
    env = run_env(make_spec(tmp_path), template, 1, {}, base={"PATH": "/usr/bin"}, layer=layer)

    assert env["PATH"] == f"{layer}/bin:{template}/bin:/usr/bin"
    assert env["VIRTUAL_ENV"] == str(layer)


def start(tmp_path: Path, command: str, **kwargs: float) -> RunProcess:
    env = run_env(make_spec(tmp_path, gpus=(3,)), tmp_path / "venv", 5, {"GREETING": "hi"})
    run = RunProcess(5, command, env=env, cwd=tmp_path, batcher=LogBatcher(), **kwargs)
    run.start()
    return run


def wait_finished(run: RunProcess, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not run.finished and time.monotonic() < deadline:
        time.sleep(0.02)
    assert run.finished, f"run {run.run_id} did not finish"


def output(run: RunProcess) -> dict[str, str]:
    run.batcher.seal()
    streams: dict[str, str] = {"stdout": "", "stderr": ""}
    for chunk in run.batcher.unacked(max_bytes=10**9):
        streams[chunk.stream] += chunk.data
    return streams


def test_a_run_captures_both_streams_and_its_exit_code(tmp_path: Path) -> None:
    run = start(
        tmp_path,
        'echo "cvd=$CUDA_VISIBLE_DEVICES $GREETING in $PWD"; echo "bad" >&2; exit 3',
    )
    wait_finished(run)

    assert run.exit_code == 3
    streams = output(run)
    assert streams["stdout"] == f"cvd=3 hi in {tmp_path}\n"
    assert streams["stderr"] == "bad\n"


def wait_for_program(run: RunProcess, name: str, timeout: float = 10.0) -> None:
    """Until a process of the run's group has exec'd `name`. A SIGTERM sent sooner may meet
    bash between fork and exec, where its own handler takes the signal and the program
    never sees it: the stop then waits out its grace and kills (-9, not -15)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for stat in all_stats():
            if stat.pgrp == run.pid and _comm(stat.pid) == name:
                return
        time.sleep(0.02)
    raise AssertionError(f"run {run.run_id} did not start {name}")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_a_run_is_its_own_process_group(tmp_path: Path) -> None:
    run = start(tmp_path, "sleep 30")
    try:
        assert os.getpgid(run.pid) == run.pid
        assert os.getsid(run.pid) == os.getsid(0)  # same session: a force stop finds it
        wait_for_program(run, "sleep")
    finally:
        stop_runs([run], grace_s=5)
    wait_finished(run)
    assert run.exit_code == -15


def test_stop_kills_a_run_that_ignores_sigterm_with_its_children(tmp_path: Path) -> None:
    run = start(tmp_path, "trap '' TERM; sleep 60 & echo $!; sleep 60 & echo $!; wait")
    deadline = time.monotonic() + 5
    while output(run)["stdout"].count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    children = [int(pid) for pid in output(run)["stdout"].split()]
    assert len(children) == 2

    started = time.monotonic()
    stop_runs([run], grace_s=0.5)
    wait_finished(run)

    assert 0.5 <= time.monotonic() - started < 5
    assert run.exit_code == -9
    for pid in children:
        child = read_stat(pid)
        assert child is None or not child.running


def test_processes_left_behind_by_a_finished_run_are_stopped(tmp_path: Path) -> None:
    run = start(tmp_path, "sleep 60 & echo $!", leftover_grace_s=0.5)
    wait_finished(run)

    assert run.exit_code == 0
    child = read_stat(int(output(run)["stdout"]))
    assert child is None or not child.running


def test_a_run_that_cannot_start_ends_with_127(tmp_path: Path) -> None:
    run = RunProcess(1, "true", env={}, cwd=tmp_path / "missing", batcher=LogBatcher())
    run.start()

    assert run.finished and run.exit_code == 127
    assert "could not start" in output(run)["stderr"]
