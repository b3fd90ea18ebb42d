"""The local backend against real detached processes: liveness, pid reuse, stop and kill."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpulease.backends.base import RunnerSpec
from gpulease.backends.local import LocalBackend
from gpulease.backends.procfs import read_stat
from gpulease.core.templates import get_template

Start = Callable[..., tuple[subprocess.Popen[bytes], str]]


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def children_of(pid: int) -> list[int]:
    found = (read_stat(int(entry)) for entry in os.listdir("/proc") if entry.isdigit())
    return [s.pid for s in found if s is not None and s.ppid == pid]


def pid_gone(pid: int) -> bool:
    found = read_stat(pid)
    return found is None or found.state == "Z"


@pytest.fixture
def detached() -> Iterator[Start]:
    """Start a command as its own session leader, like a runner; reap it afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str) -> tuple[subprocess.Popen[bytes], str]:
        process = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE)
        started.append(process)
        found = read_stat(process.pid)
        assert found is not None
        return process, json.dumps({"pid": process.pid, "start_time": found.start_time})

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_alive_follows_the_process(detached: Start) -> None:
    backend = LocalBackend()
    process, handle = detached("sleep", "30")

    assert backend.alive(handle)
    process.kill()
    assert wait_until(lambda: not backend.alive(handle))  # a zombie counts as dead
    process.wait()
    assert not backend.alive(handle)


def test_a_reused_pid_is_not_our_runner(
    detached: Start,
) -> None:
    backend = LocalBackend()
    process, handle = detached("sleep", "30")
    data = json.loads(handle)
    stale = json.dumps({"pid": data["pid"], "start_time": data["start_time"] - 1})

    assert not backend.alive(stale)
    backend.stop(stale)
    backend.stop(stale, force=True)
    time.sleep(0.1)
    assert process.poll() is None  # the other process was left alone


def test_stop_terminates_and_is_idempotent(
    detached: Start,
) -> None:
    backend = LocalBackend()
    process, handle = detached("sleep", "30")

    backend.stop(handle)
    assert process.wait(timeout=5) == -15
    backend.stop(handle)
    backend.stop(handle, force=True)
    backend.stop("not a handle")
    backend.stop(json.dumps({"pid": 2**22 + 7, "start_time": 1}), force=True)


TREE = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
jobs = [
    subprocess.Popen([sys.executable, "-c", stubborn], process_group=0),
    subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60 & wait"], process_group=0),
]
time.sleep(0.5)
print(" ".join(str(job.pid) for job in jobs), flush=True)
time.sleep(60)
"""


def test_force_kills_the_runner_and_all_its_jobs(
    detached: Start,
) -> None:
    backend = LocalBackend()
    runner, handle = detached(sys.executable, "-c", TREE)
    assert runner.stdout is not None
    job_pids = [int(pid) for pid in runner.stdout.readline().split()]
    grandchildren = children_of(job_pids[1])
    assert len(grandchildren) == 2

    backend.stop(handle)  # the runner ignores SIGTERM here
    time.sleep(0.2)
    assert backend.alive(handle)

    backend.stop(handle, force=True)

    assert runner.wait(timeout=5) == -9
    for pid in job_pids + grandchildren:
        assert wait_until(lambda pid=pid: pid_gone(pid)), f"process {pid} survived"


FAKE_PYTHON = """#!/bin/sh
echo "runner argv: $*"
env > env.txt
exec sleep 30
"""


def test_start_writes_a_private_spec_and_detaches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_python = tmp_path / "python"
    fake_python.write_text(FAKE_PYTHON)
    fake_python.chmod(0o755)
    monkeypatch.setenv("GPULEASE_DATABASE_URL", "postgresql://secret")
    run_dir = tmp_path / "runs" / "7"
    spec = RunnerSpec(
        instance_id=7,
        server_url="http://127.0.0.1:1",
        token="tok-7",
        workspace=tmp_path / "ws",
        run_dir=run_dir,
        env_cache=tmp_path / "envs",
        template=get_template("python"),
        gpu_indices=(1,),
    )
    backend = LocalBackend(python=str(fake_python))

    handle = backend.start(spec)
    try:
        assert backend.alive(handle)
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        spec_file = run_dir / "spec.json"
        assert stat.S_IMODE(spec_file.stat().st_mode) == 0o600
        assert RunnerSpec.from_json(spec_file.read_text()) == spec
        assert wait_until(
            lambda: (
                (run_dir / "env.txt").exists()
                and "runner argv" in (run_dir / "runner.log").read_text()
            )
        )
        log_text = (run_dir / "runner.log").read_text()
        assert f"runner argv: -m gpulease.runner {spec_file}" in log_text
        assert wait_until(lambda: "PATH=" in (run_dir / "env.txt").read_text())
        assert "GPULEASE_DATABASE_URL" not in (run_dir / "env.txt").read_text()
        pid = json.loads(handle)["pid"]
        found = read_stat(pid)
        assert found is not None and found.session == pid  # its own session
    finally:
        backend.stop(handle)
    assert wait_until(lambda: not backend.alive(handle))
    assert wait_until(lambda: read_stat(json.loads(handle)["pid"]) is None)  # reaped


def _proc_link(pid: int, name: str) -> str:
    return os.readlink(f"/proc/{pid}/{name}")


def test_a_prestarted_runner_takes_the_next_spec_as_a_cold_one_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULEASE_DATABASE_URL", "postgresql://secret")
    run_dir = tmp_path / "runs" / "8"
    spec = RunnerSpec(
        instance_id=8,
        server_url="http://127.0.0.1:1",  # nothing answers: it keeps trying until stopped
        token="tok-8",
        workspace=tmp_path / "ws",
        run_dir=run_dir,
        env_cache=tmp_path / "envs",
        template=get_template("python"),
    )
    backend = LocalBackend()
    backend.prestart(tmp_path / "runs")
    warm = backend._warm
    assert warm is not None
    assert f"--warm {tmp_path}/runs/" in " ".join(warm.args)  # pgrep -f finds it
    handle = backend.start(spec)
    try:
        pid = json.loads(handle)["pid"]
        assert pid == warm.pid  # the waiting process, not a new one
        found = read_stat(pid)
        assert found is not None and found.session == pid
        assert wait_until(lambda: _proc_link(pid, "fd/0") == "/dev/null", timeout=30)
        assert _proc_link(pid, "cwd") == str(run_dir)
        assert _proc_link(pid, "fd/1") == _proc_link(pid, "fd/2") == str(run_dir / "runner.log")
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"GPULEASE_DATABASE_URL" not in environ
        assert wait_until(lambda: backend._warm is not None and backend._warm.pid != pid)
    finally:
        backend.stop(handle, force=True)
        backend.stop_warm()
    assert wait_until(lambda: not backend.alive(handle))


def test_a_waiting_runner_exits_when_its_pipe_closes(tmp_path: Path) -> None:
    backend = LocalBackend()
    backend.prestart(tmp_path)
    warm = backend._warm
    assert warm is not None
    backend.stop_warm()
    assert warm.returncode == 0


def test_no_runner_is_kept_waiting_after_stop_warm(tmp_path: Path) -> None:
    """A launch starts the next waiting runner from a thread of its own; when that thread
    runs only after stop_warm(), it starts none (nobody would close its pipe)."""
    backend = LocalBackend()
    backend.prestart(tmp_path)
    backend.stop_warm()
    backend._warm_next()  # what a launch's thread does
    assert backend._warm is None
