"""Escape attempts from inside a run, through a real server, CLI and runners: each fails."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from processes import Platform

pytestmark = pytest.mark.e2e

PASSWORD = "password-123"
MARKER = "sleep 1234.5"  # ann's long job, easy to find in the host's process table


def _register(platform: Platform, name: str) -> None:
    platform.cli("register", "--server", platform.url, "--name", name, "--password", PASSWORD)


def _host_pid_of(command: str, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if cmdline.decode(errors="replace").strip() == command:
                return int(entry)
        time.sleep(0.2)
    raise AssertionError(f"no process {command!r} on the host")


def test_a_job_cannot_read_the_server_or_another_tenant(platform: Platform, tmp_path: Path) -> None:
    home = platform.home
    # The server's secrets, as they lie in its data directory.
    master_key = home / "keys" / "master.key"
    if not master_key.exists():
        master_key.parent.mkdir(mode=0o700, exist_ok=True)
        master_key.write_text("dummy master key")
    database = home / "gpulease.db"
    if not database.exists():  # PostgreSQL: stand a file in for the SQLite database
        database.write_text("dummy database")

    _register(platform, "ann")
    platform.cli(
        "instance", "create", "--gpu", "T4:1", "--template", "python", "--name", "a", "--wait"
    )
    ann: Any = platform.cli_json("instance", "show", "a")
    ann_workspace = home / "workspaces" / str(ann["id"])
    platform.cli("exec", "a", "--", "echo ann-secret > secret.txt")
    assert (ann_workspace / "secret.txt").read_text() == "ann-secret\n"
    ann_dataset = home / "datasets" / "ann-cats-v1"  # a materialised dataset of ann's
    ann_dataset.mkdir(parents=True, exist_ok=True)
    (ann_dataset / "cat.jpg").write_text("ann's cat")
    ann_job = platform.popen_cli(
        "exec",
        "a",
        "--",
        f"echo private > /tmp/ann-tmp; echo started; exec {MARKER}",
        stderr_path=tmp_path / "ann.err",
    )
    try:
        assert ann_job.stdout is not None
        assert ann_job.stdout.readline().strip() == "started"
        ann_pid = _host_pid_of(MARKER)

        _register(platform, "bob")
        platform.cli(
            "instance",
            "create",
            "--gpu",
            "A100-80GB:1",  # ann holds the only T4
            "--template",
            "python",
            "--name",
            "b",
            "--wait",
        )
        secrets = {
            "database": database,
            "master-key": master_key,
            "ann-workspace": ann_workspace / "secret.txt",
            "ann-dataset": ann_dataset / "cat.jpg",
            "runner-spec": home / "runners" / str(ann["id"]) / "spec.json",
        }
        reads = "".join(
            f"cat {path} >/dev/null 2>&1 && echo {name}=READ || echo {name}=denied; "
            for name, path in secrets.items()
        )
        script = (
            reads
            + f"ls {home} >/dev/null 2>&1 && echo home=LISTED || echo home=denied; "
            + f"test -e /proc/{ann_pid} && echo proc=VISIBLE || echo proc=hidden; "
            + f"kill -0 {ann_pid} 2>/dev/null && echo kill=SIGNALLED || echo kill=denied; "
            + "echo pids=$(ls /proc | grep -cE '^[0-9]+$'); "
            + "(echo x >> /usr/bin/evil) 2>/dev/null && echo usr=WROTE || echo usr=denied; "
            + "(echo x >> /etc/passwd) 2>/dev/null && echo etc=WROTE || echo etc=denied; "
            + "cat /tmp/ann-tmp >/dev/null 2>&1 && echo tmp=READ || echo tmp=denied; "
            + "env | grep -q '^GPULEASE_DATABASE_URL=' && echo dburl=LEAKED || echo dburl=absent; "
            + "echo pwd=$PWD"
        )
        result = platform.cli("exec", "b", "--", script)
        seen = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
        assert {key: seen.get(key) for key in secrets} == dict.fromkeys(secrets, "denied")
        assert seen["home"] == "denied"
        assert seen["proc"] == "hidden" and seen["kill"] == "denied"
        assert int(seen["pids"]) < 10, seen  # only bob's own few processes
        assert seen["usr"] == "denied" and seen["etc"] == "denied"
        assert seen["tmp"] == "denied"
        assert seen["dburl"] == "absent"
        assert seen["pwd"] == "/workspace"
        # ann's job lived through all of it
        assert ann_job.poll() is None
    finally:
        ann_job.terminate()
        ann_job.wait(30)
        if ann_job.stdout is not None:
            ann_job.stdout.close()
