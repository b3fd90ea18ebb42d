"""What a sandboxed job can see of the runner's channel: neither the server's socket nor the
spec file with the launch secret (both lie in the server's data directory)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpulease.runner.sandbox import Sandbox, base_environment, probe
from gpulease.server.runner_socket import bind_socket


def test_a_sandboxed_job_sees_neither_the_server_socket_nor_the_spec(tmp_path: Path) -> None:
    if (reason := probe()) is not None:
        pytest.skip(f"bubblewrap cannot sandbox here: {reason}")
    home = tmp_path / "home"  # laid out as the server lays out GPULEASE_HOME
    workspace, run_dir, venv = (
        home / "workspaces" / "9",
        home / "runners" / "9",
        home / "envs" / "v",
    )
    for directory in (workspace, run_dir, venv):
        directory.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    spec = run_dir / "spec.json"
    spec.write_text('{"token": "glr_launch_secret"}')
    server_socket = home / "run" / "server.sock"
    listener = bind_socket(server_socket)
    listener.listen()
    jail = Sandbox(workspace=workspace, env_dir=venv, hostname="gpulease-9", private=(run_dir,))
    script = (
        f"test -e {server_socket} && echo SOCKET-VISIBLE; "
        f"cat {spec} 2>/dev/null; "
        f"ls {home}/run {home}/runners 2>/dev/null; echo done"
    )
    try:
        result = subprocess.run(
            jail.command(["bash", "-c", script]),
            env=jail.environment({**base_environment(os.environ)}),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        listener.close()
    assert result.stdout.strip().endswith("done"), result.stderr
    assert "SOCKET-VISIBLE" not in result.stdout
    assert "glr_launch_secret" not in result.stdout
    assert "server.sock" not in result.stdout and "spec.json" not in result.stdout
    assert server_socket.exists()  # outside the sandbox it is there all along
