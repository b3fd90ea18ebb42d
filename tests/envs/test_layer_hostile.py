"""A job owns its venv layer: the runner builds it and runs its `pip freeze` only inside the
instance's sandbox, as the job, so nothing the job planted there reaches the host."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from gpulease.core.templates import get_template
from gpulease.envs.build import EnvBuildError, ensure_env
from gpulease.envs.layer import ensure_layer, layer_dir, site_packages
from gpulease.envs.snapshot import freeze
from gpulease.runner.sandbox import Sandbox, find_bwrap
from processes import ENV_CACHE
from wheels import make_wheel

BWRAP = find_bwrap()
needs_bwrap = pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed")
JOB_UID = 2_000_000_901


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cached = ensure_env(get_template("python"), ENV_CACHE)
    env = tmp_path_factory.mktemp("template") / "venv"
    shutil.copytree(cached, env, symlinks=True)
    return env


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A host file outside the workspace (the master key, say) that must stay as it is."""
    path = tmp_path / "host" / "master.key"
    path.parent.mkdir()
    path.write_text("the master key\n")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    return path


def untouched(canary: Path) -> bool:
    return (
        canary.read_text() == "the master key\n"
        and canary.stat().st_mtime_ns == 1_000_000_000
        and sorted(p.name for p in canary.parent.iterdir()) == [canary.name]
    )


def sandbox_for(workspace: Path, template: Path, tmp_path: Path) -> Sandbox:
    assert BWRAP is not None
    run_dir = tmp_path / "runner"
    run_dir.mkdir(exist_ok=True)
    return Sandbox(
        workspace=workspace,
        env_dir=template,
        hostname="gpulease-9",
        private=(run_dir,),
        bwrap=BWRAP,
        uid=JOB_UID if os.geteuid() == 0 else None,
    )


def sandboxed_processes(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


@needs_bwrap
def test_the_layer_is_made_in_the_sandbox_and_freezes_there(template: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    sandbox = sandbox_for(workspace, template, tmp_path)
    layer = ensure_layer(template, workspace, sandbox=sandbox)
    assert layer == layer_dir(workspace)
    assert (layer / "pyvenv.cfg").is_file()
    assert (layer / "bin" / "pip").read_text().startswith("#!/bin/sh\n")
    if sandbox.uid is not None:  # made by the job's uid, so its pip can install there
        assert site_packages(layer).stat().st_uid == JOB_UID
    make_wheel(workspace, "pkg", "1.0")
    outcome = sandbox_for(workspace, template, tmp_path)
    assert freeze(layer, sandbox=outcome) == []
    # the layer keeps working on the next start
    assert ensure_layer(template, workspace, sandbox=sandbox) == layer


@needs_bwrap
def test_a_pyvenv_cfg_link_to_a_host_file_changes_nothing_on_the_host(
    template: Path, tmp_path: Path, canary: Path
) -> None:
    """The job points pyvenv.cfg at a host file and makes the layer look stale, so that
    `venv --upgrade` rewrites it: in the sandbox the host file does not even exist."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    sandbox = sandbox_for(workspace, template, tmp_path)
    layer = ensure_layer(template, workspace, sandbox=sandbox)
    (layer / "pyvenv.cfg").unlink()
    (layer / "pyvenv.cfg").symlink_to(canary)
    (layer / "bin" / "activate").unlink()
    (layer / "bin" / "activate").symlink_to(canary)
    ensure_layer(template, workspace, sandbox=sandbox)
    assert untouched(canary)


def test_without_a_sandbox_links_in_the_layer_are_refused(
    template: Path, tmp_path: Path, canary: Path
) -> None:
    workspace = tmp_path / "workspace"
    (workspace / ".gpulease" / "venv").mkdir(parents=True)
    (workspace / ".gpulease" / "venv" / "pyvenv.cfg").symlink_to(canary)
    with pytest.raises(EnvBuildError, match="remove .gpulease/venv"):
        ensure_layer(template, workspace)
    (workspace / ".gpulease" / "venv" / "pyvenv.cfg").unlink()
    os.mkfifo(workspace / ".gpulease" / "venv" / "pyvenv.cfg")
    with pytest.raises(EnvBuildError, match="special file"):
        ensure_layer(template, workspace)
    shutil.rmtree(workspace / ".gpulease")
    (workspace / ".gpulease").mkdir()
    (workspace / ".gpulease" / "venv").symlink_to(canary.parent)
    with pytest.raises(EnvBuildError, match="links outside it"):
        ensure_layer(template, workspace)
    assert untouched(canary)


def _plant_python(layer: Path, script: str) -> None:
    python = layer / "bin" / "python"
    python.unlink()
    python.write_text("#!/bin/sh\n" + script)
    python.chmod(0o755)


@needs_bwrap
def test_a_replaced_layer_python_runs_only_in_the_sandbox_and_leaves_nothing_running(
    template: Path, tmp_path: Path, canary: Path
) -> None:
    """The job swaps its layer's python for a program that reads the host's files, writes
    next to them and leaves a process behind, then asks for `gpulease templates save`."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    sandbox = sandbox_for(workspace, template, tmp_path)
    layer = ensure_layer(template, workspace, sandbox=sandbox)
    marker = f"gpulease-leftover-{os.getpid()}-{time.monotonic_ns()}"
    _plant_python(
        layer,
        f"cat {canary} > /workspace/stolen 2>/dev/null\n"
        f"echo pwned > {canary.parent}/planted 2>/dev/null\n"
        f"setsid sh -c 'sleep 300' {marker} </dev/null >/dev/null 2>&1 &\n"
        "echo evil==1.0\n",
    )
    assert freeze(layer, sandbox=sandbox) == ["evil==1.0"]
    assert untouched(canary)
    assert not (workspace / "stolen").exists() or (workspace / "stolen").read_text() == ""
    deadline = time.monotonic() + 5
    while sandboxed_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandboxed_processes(marker) == []


@needs_bwrap
def test_hostile_freeze_output_is_bounded(template: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    sandbox = sandbox_for(workspace, template, tmp_path)
    layer = ensure_layer(template, workspace, sandbox=sandbox)
    _plant_python(layer, "yes pkg==1.0\n")  # prints forever
    with pytest.raises(RuntimeError, match="more than 1 MiB"):
        freeze(layer, sandbox=sandbox)
    _plant_python(layer, "head -c 5000 /dev/zero | tr '\\0' a; echo\n")
    with pytest.raises(RuntimeError, match="longer than 1000"):
        freeze(layer, sandbox=sandbox)
    _plant_python(layer, "sleep 300\n")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="did not finish in 1 s"):
        freeze(layer, 1.0, sandbox=sandbox)
    assert time.monotonic() - started < 10
