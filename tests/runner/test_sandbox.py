"""The bubblewrap sandbox with the real bwrap: what a job can see, write, signal and run."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpulease.backends.procfs import read_stat
from gpulease.runner.jobs import RunProcess, stop_runs
from gpulease.runner.logs import LogBatcher
from gpulease.runner.sandbox import (
    GpuDevice,
    Sandbox,
    SandboxError,
    base_environment,
    exit_code_from_sandbox,
    find_bwrap,
    gpu_device_nodes,
    probe,
    python_install,
)

BWRAP = find_bwrap()
pytestmark = pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed")
# The venv the tests run in stands in for a template venv: a venv on a Python install.
VENV = Path(sys.prefix)


@dataclass
class Host:
    """A data directory laid out as the server's, with one instance's sandbox in it."""

    home: Path
    workspace: Path
    other_workspace: Path
    dataset: Path
    other_dataset: Path
    sandbox: Sandbox


@pytest.fixture
def host(tmp_path: Path) -> Host:
    home = tmp_path / "home"
    (home / "keys").mkdir(parents=True)
    (home / "keys" / "master.key").write_text("the master key")
    (home / "gpulease.db").write_text("the database")
    run_dir = home / "runners" / "1"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text('{"token": "runner-secret"}')
    workspace = home / "workspaces" / "1"
    workspace.mkdir(parents=True)
    other = home / "workspaces" / "2"
    other.mkdir()
    (other / "notes.txt").write_text("bob's notes")
    dataset = home / "datasets" / "cats-v1"
    dataset.mkdir(parents=True)
    (dataset / "cat.jpg").write_bytes(b"meow")
    other_dataset = home / "datasets" / "dogs-v1"
    other_dataset.mkdir()
    (other_dataset / "dog.jpg").write_bytes(b"woof")
    assert BWRAP is not None
    sandbox = Sandbox(
        workspace=workspace,
        env_dir=VENV,
        hostname="gpulease-1",
        datasets={"cats": dataset},
        private=(run_dir,),
        bwrap=BWRAP,
    )
    return Host(home, workspace, other, dataset, other_dataset, sandbox)


def start(host: Host, command: str, **kwargs: float) -> RunProcess:
    env = host.sandbox.environment(base_environment(os.environ))
    env["PATH"] = f"{VENV / 'bin'}:{env['PATH']}"
    run = RunProcess(
        1,
        command,
        env=env,
        cwd=host.workspace,
        batcher=LogBatcher(),
        sandbox=host.sandbox,
        **kwargs,
    )
    run.start()
    return run


def wait(run: RunProcess, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not run.finished and time.monotonic() < deadline:
        time.sleep(0.02)
    assert run.finished, "the run did not finish"


def output(run: RunProcess) -> tuple[str, str]:
    run.batcher.seal()
    streams = {"stdout": "", "stderr": ""}
    for chunk in run.batcher.unacked(max_bytes=10**9):
        streams[chunk.stream] += chunk.data
    return streams["stdout"], streams["stderr"]


def run_script(host: Host, command: str) -> tuple[int | None, str, str]:
    run = start(host, command)
    wait(run)
    out, err = output(run)
    return run.exit_code, out, err


def test_bwrap_works_on_this_host() -> None:
    assert probe() is None
    missing = probe("/nonexistent/bwrap")
    assert missing is not None and "could not be run" in missing


def test_the_workspace_is_home_and_writable(host: Host) -> None:
    code, out, err = run_script(host, 'echo "$PWD $HOME $TMPDIR"; echo made > result.txt; id -u')
    assert code == 0, err
    assert out.splitlines()[0] == "/workspace /workspace /tmp"
    assert (host.workspace / "result.txt").read_text() == "made\n"


def test_the_data_directory_and_other_tenants_are_invisible(host: Host) -> None:
    secrets = [
        host.home / "gpulease.db",
        host.home / "keys" / "master.key",
        host.home / "runners" / "1" / "spec.json",
        host.other_workspace / "notes.txt",
        host.other_dataset / "dog.jpg",
        host.workspace,  # its own host path is not where it is mounted
        Path("/root"),
    ]
    script = "; ".join(f"cat {path} >/dev/null 2>&1 && echo READ {path}" for path in secrets)
    code, out, _ = run_script(host, script + f"; ls {host.home} 2>&1; true")
    assert code == 0
    assert "READ" not in out
    assert "master.key" not in out and "gpulease.db" not in out


def test_datasets_are_read_only_under_data(host: Host) -> None:
    code, out, err = run_script(
        host,
        "cat /data/cats/cat.jpg; echo; ls /data; touch /data/cats/new 2>/dev/null || echo refused",
    )
    assert code == 0, err
    assert out.splitlines() == ["meow", "cats", "refused"]
    assert not (host.dataset / "new").exists()


def test_system_directories_are_read_only_and_tmp_is_private(host: Host, tmp_path: Path) -> None:
    (tmp_path / "host-file").write_text("host")
    script = (
        "for path in /usr/evil /etc/evil /bin/evil /etc/passwd; do "
        '  (echo x >> "$path") 2>/dev/null && echo "WROTE $path"; done; '
        f"cat {tmp_path / 'host-file'} 2>/dev/null && echo SAW-HOST-TMP; "
        "echo private > /tmp/mine; cat /tmp/mine; ls /tmp; cat /etc/shadow 2>/dev/null | head -c1"
    )
    marker = Path("/tmp") / f"gpulease-host-marker-{os.getpid()}"
    marker.write_text("host")
    try:
        code, out, err = run_script(host, script)
    finally:
        marker.unlink()
    assert code == 0, err
    assert "WROTE" not in out and "SAW-HOST-TMP" not in out
    first, *listing = out.splitlines()
    assert first == "private"
    # the job's /tmp is its own: its file is there, the host's are not (bwrap may add
    # empty mount points there for binds that live under the host's /tmp, like a venv)
    assert "mine" in listing and marker.name not in listing
    assert not Path("/tmp/mine").exists() or Path("/tmp/mine").read_text() != "private\n"


def test_the_job_sees_only_its_own_processes(host: Host) -> None:
    runner = os.getpid()
    code, out, err = run_script(
        host,
        f"ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '; echo; "
        f"kill -0 {runner} 2>/dev/null && echo SIGNALLED || echo no-such-process; hostname",
    )
    assert code == 0, err
    pids, verdict, hostname = out.splitlines()
    assert all(int(pid) < 10 for pid in pids.split()), pids
    assert str(runner) not in pids.split()
    assert verdict == "no-such-process"
    assert hostname == "gpulease-1"


def test_the_template_venv_runs_inside(host: Host) -> None:
    code, out, err = run_script(
        host, "python -c 'import sys, sqlite3, ssl; print(sys.prefix)'; which python"
    )
    assert code == 0, err
    prefix, python = out.splitlines()
    assert prefix == str(VENV)
    assert python == str(VENV / "bin" / "python")


def test_stop_sends_sigterm_to_the_job_and_kill_follows(host: Host) -> None:
    run = start(host, "trap 'echo got TERM; exit 5' TERM; sleep 60 & wait")
    time.sleep(0.5)
    stop_runs([run], grace_s=5)
    wait(run)
    assert run.exit_code == 5
    assert output(run)[0] == "got TERM\n"

    stubborn = start(host, "trap '' TERM; sleep 60 & wait; sleep 60")
    time.sleep(0.5)
    started = time.monotonic()
    stop_runs([stubborn], grace_s=0.5)
    wait(stubborn)
    assert stubborn.exit_code == -9
    assert time.monotonic() - started < 10


CHECKPOINTING_JOB = """
import pathlib, signal, sys, time
def saved(*_):
    time.sleep(1)
    print("saved", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, saved)
pathlib.Path("started").write_text("yes")
time.sleep(60)
"""


def test_a_job_under_a_script_keeps_its_grace(host: Host) -> None:
    # bash ends on the stop's SIGTERM only once its command has: bubblewrap's init exits
    # with bash, which would otherwise kill the job while it saves its checkpoint.
    (host.workspace / "job.py").write_text(CHECKPOINTING_JOB)
    run = start(host, "set -e; python3 job.py; echo next")
    deadline = time.monotonic() + 30
    while not (host.workspace / "started").exists():
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.05)
    stop_runs([run], grace_s=10)
    wait(run)
    assert output(run)[0] == "saved\n"
    assert run.exit_code == -signal.SIGTERM


def test_processes_a_job_leaves_behind_die_with_it(host: Host) -> None:
    run = start(host, "sleep 60 & echo $!")
    wait(run)
    assert run.exit_code == 0
    assert not run.group_exists()
    # Seen from the host, nothing of the sandbox is still running.
    init = read_stat(run.pid)
    assert init is None or not init.running


def test_a_signal_death_reads_as_minus_the_signal(host: Host) -> None:
    code, _, _ = run_script(host, "kill -TERM $$")
    assert code == -signal.SIGTERM
    assert exit_code_from_sandbox(3) == 3
    assert exit_code_from_sandbox(137) == -9
    assert exit_code_from_sandbox(255) == 255


def test_a_bind_that_would_show_the_data_directory_is_refused(host: Host) -> None:
    wide = Sandbox(
        workspace=host.workspace,
        env_dir=host.home,  # as if a venv lived in the data directory itself
        hostname="x",
        private=(host.home / "runners" / "1",),
    )
    with pytest.raises(SandboxError, match="must not see"):
        wide.command(["true"])
    run = RunProcess(9, "true", env={}, cwd=host.workspace, batcher=LogBatcher(), sandbox=wide)
    run.start()
    assert run.finished and run.exit_code == 127
    assert "must not see" in output(run)[1]


def test_a_dataset_name_must_be_a_plain_directory_name(host: Host) -> None:
    bad = Sandbox(
        workspace=host.workspace,
        env_dir=VENV,
        hostname="x",
        datasets={"../etc": host.dataset},
    )
    with pytest.raises(SandboxError, match="cannot be a directory"):
        bad.command(["true"])


def test_only_the_instances_gpu_device_nodes_are_bound(tmp_path: Path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).write_text("")
    gpus = (GpuDevice(index=1, minor=1, uuid="GPU-bbb"),)

    assert gpu_device_nodes(gpus, tmp_path) == [
        tmp_path / "nvidia1",
        tmp_path / "nvidiactl",
        tmp_path / "nvidia-uvm",
    ]
    assert gpu_device_nodes((), tmp_path) == []
    sandbox = Sandbox(workspace=tmp_path, env_dir=VENV, hostname="x", gpus=gpus, dev=tmp_path)
    argv = sandbox.command(["true"])
    bound = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--dev-bind"]
    assert bound == [str(tmp_path / n) for n in ("nvidia1", "nvidiactl", "nvidia-uvm")]
    assert sandbox.environment({})["CUDA_VISIBLE_DEVICES"] == "GPU-bbb"


def test_workspace_paths_are_translated_to_workspace_inside(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    sandbox = Sandbox(workspace=workspace, env_dir=VENV, hostname="x")
    env = sandbox.environment(
        {
            "PATH": f"{workspace}/.gpulease/venv/bin:{VENV}/bin:{workspace}-other/bin:/usr/bin",
            "VIRTUAL_ENV": f"{workspace}/.gpulease/venv",
        }
    )

    assert env["PATH"] == f"/workspace/.gpulease/venv/bin:{VENV}/bin:{workspace}-other/bin:/usr/bin"
    assert env["VIRTUAL_ENV"] == "/workspace/.gpulease/venv"
    assert sandbox.inside(workspace) == "/workspace"


def test_the_environment_keeps_the_runners_secrets_out() -> None:
    env = base_environment(
        {
            "PATH": "/root/.pyenv/shims:/usr/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HTTPS_PROXY": "http://proxy:3128",
            "AWS_SECRET_ACCESS_KEY": "s3cret",
            "PGPASSWORD": "pw",
            "HOME": "/root",
        }
    )
    assert env == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HTTPS_PROXY": "http://proxy:3128",
    }


def test_python_install_is_read_from_pyvenv_cfg(tmp_path: Path) -> None:
    (tmp_path / "pyvenv.cfg").write_text("home = /opt/python/3.11/bin\nversion = 3.11.7\n")
    assert python_install(tmp_path) == Path("/opt/python/3.11")
    assert python_install(tmp_path / "missing") is None
