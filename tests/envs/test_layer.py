"""An instance's venv layer over a template venv: real venvs, real pip, local wheels only."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpulease.core.templates import get_template
from gpulease.envs.build import EnvBuildError, ensure_env
from gpulease.envs.layer import PTH_NAME, ensure_layer, layer_dir, site_packages
from gpulease.envs.snapshot import freeze
from processes import ENV_CACHE
from wheels import make_wheel


def pip(python: Path, *args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(python), "-m", "pip", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(cwd or python.parent),
            "PIP_NO_INDEX": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_CACHE_DIR": "1",
        },
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def listing(directory: Path) -> dict[str, tuple[int, int]]:
    """Every entry under directory with its size and mtime: what "untouched" compares."""
    result = {}
    for path in sorted(directory.rglob("*")):
        stat = path.lstat()
        result[str(path.relative_to(directory))] = (stat.st_size, stat.st_mtime_ns)
    return result


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A template venv holding pip and `base` 1.0: the cached python template, copied."""
    cached = ensure_env(get_template("python"), ENV_CACHE)
    env = tmp_path_factory.mktemp("template") / "venv"
    shutil.copytree(cached, env, symlinks=True)
    wheels = tmp_path_factory.mktemp("wheels")
    make_wheel(wheels, "base", "1.0")
    pip(env / "bin" / "python", "install", "--find-links", str(wheels), "base")
    return env


def test_the_layer_sees_the_template_and_installs_into_itself(
    template: Path, tmp_path: Path
) -> None:
    before = listing(template)
    workspace = tmp_path / "workspace"
    layer = ensure_layer(template, workspace)
    assert layer == layer_dir(workspace) == workspace / ".gpulease" / "venv"
    python = layer / "bin" / "python"
    pth = site_packages(layer) / PTH_NAME
    assert str(site_packages(template)) in pth.read_text()
    for shim in ("pip", "pip3"):
        assert os.access(layer / "bin" / shim, os.X_OK)

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "pkg", "1.0")
    make_wheel(wheels, "base", "2.0")
    # by name from a directory: pinned NAME==VERSION by freeze (a wheel named by its path
    # freezes as `pkg @ file:///...`)
    pip(python, "install", "--find-links", str(wheels), "pkg", "base==2.0")
    assert (site_packages(layer) / "pkg" / "__init__.py").exists()
    assert (site_packages(layer) / "base" / "__init__.py").read_text() == "VERSION = '2.0'\n"

    assert freeze(layer) == ["base==2.0", "pkg==1.0"]
    assert freeze(template) == ["base==1.0"]
    assert listing(template) == before  # nothing written to the shared venv


def test_the_pip_shim_installs_into_the_layer(template: Path, tmp_path: Path) -> None:
    layer = ensure_layer(template, tmp_path)
    wheel = make_wheel(tmp_path, "pkg", "1.0")
    done = subprocess.run(
        ["pip", "install", "--no-index", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        env={"PATH": f"{layer / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (site_packages(layer) / "pkg").is_dir()
    assert not (site_packages(template) / "pkg").exists()


def test_ensure_layer_is_idempotent_and_keeps_installed_packages(
    template: Path, tmp_path: Path
) -> None:
    layer = ensure_layer(template, tmp_path)
    pip(layer / "bin" / "python", "install", str(make_wheel(tmp_path, "pkg", "1.0")))
    assert (site_packages(layer) / "pkg").is_dir()
    (layer / "bin" / "pip").write_text("broken\n")  # the renter's to break; mended next time
    cfg = (layer / "pyvenv.cfg").stat().st_mtime_ns
    pth = site_packages(layer) / PTH_NAME
    pth_mtime = pth.stat().st_mtime_ns

    assert ensure_layer(template, tmp_path) == layer
    assert (layer / "pyvenv.cfg").stat().st_mtime_ns == cfg  # not re-created
    assert pth.stat().st_mtime_ns == pth_mtime  # unchanged files are left alone
    assert (layer / "bin" / "pip").read_text().startswith("#!/bin/sh\n")
    assert freeze(layer)[0] == "base==1.0"
    assert freeze(layer)[1].startswith("pkg @ file://")


def test_a_link_out_of_the_workspace_is_refused(template: Path, tmp_path: Path) -> None:
    workspace, elsewhere = tmp_path / "workspace", tmp_path / "elsewhere"
    workspace.mkdir()
    elsewhere.mkdir()
    (workspace / ".gpulease").symlink_to(elsewhere)
    with pytest.raises(EnvBuildError, match="links outside it"):
        ensure_layer(template, workspace)
    assert list(elsewhere.iterdir()) == []
