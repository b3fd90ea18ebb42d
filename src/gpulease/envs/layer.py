"""An instance's writable venv layered on its template's shared, read-only venv."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

from gpulease.envs.build import EnvBuildError, env_python

log = logging.getLogger(__name__)

LAYER_DIR = Path(".gpulease") / "venv"
PTH_NAME = "_gpulease_template.pth"
SHIM = '#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n'
VENV_TIMEOUT_S = 120.0


def layer_dir(workspace: Path) -> Path:
    """Where an instance's layer lives: in its workspace, so it survives stop, start and
    resize and goes with the workspace at release."""
    return workspace / LAYER_DIR


def site_packages(env_dir: Path) -> Path:
    """A venv's site-packages (lib/pythonX.Y/site-packages); EnvBuildError when it has none."""
    found = sorted((env_dir / "lib").glob("python3*/site-packages"))
    if not found:
        raise EnvBuildError(f"the environment {env_dir} has no site-packages")
    return found[0]


def ensure_layer(template_env: Path, workspace: Path) -> Path:
    """The instance's layer venv (workspace/.gpulease/venv), created on first use with the
    template's Python; the template venv is never written to.

    Every call (idempotent) rewrites what ties the layer to the template: a .pth file that
    adds the template's site-packages after the layer's own (template packages import and
    count as installed for pip; packages installed in the layer win), and `pip`/`pip3`
    shims that run `python -m pip` with the layer's python, so `pip install X` installs
    into the layer. The layer names the template by its host path, which is also its path
    inside the sandbox. Raises EnvBuildError with a reason when the venv cannot be made.
    """
    layer = layer_dir(workspace)
    _check_inside(workspace, layer)
    if _venv_home(layer) != _venv_home(template_env):
        # New, or the template's Python moved: (re)point the layer, keeping its packages.
        layer.parent.mkdir(parents=True, exist_ok=True)
        argv = [str(env_python(template_env)), "-m", "venv", "--without-pip"]
        if (layer / "pyvenv.cfg").exists():
            argv.append("--upgrade")
        _run([*argv, str(layer)])
    template_site = site_packages(template_env)
    pth = f"import site; site.addsitedir({str(template_site)!r})\n"
    targets = [(site_packages(layer) / PTH_NAME, pth, 0o644)]
    targets += [(layer / "bin" / name, SHIM, 0o755) for name in ("pip", "pip3")]
    for path, text, mode in targets:
        _check_inside(workspace, path.parent)
        _write_if_changed(path, text, mode)
    return layer


def _check_inside(workspace: Path, path: Path) -> None:
    """The workspace is the renter's: a link in it must not make the runner write elsewhere."""
    root, resolved = workspace.resolve(), path.resolve()
    if root != resolved and root not in resolved.parents:
        raise EnvBuildError(
            f"{path.relative_to(workspace)} in the workspace links outside it; remove "
            f"{LAYER_DIR} from the workspace and start the instance again"
        )


def _venv_home(env_dir: Path) -> str | None:
    """pyvenv.cfg's `home` (the base Python's bin directory); None when env_dir is no venv."""
    try:
        text = (env_dir / "pyvenv.cfg").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "home":
            return value.strip()
    return None


def _run(argv: list[str]) -> None:
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=VENV_TIMEOUT_S,
            env={"PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvBuildError(f"the instance's venv could not be created: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise EnvBuildError(
            f"the instance's venv could not be created (exit code {done.returncode}): {tail}"
        )
    log.info("instance venv ready: %s", argv[-1])


def _write_if_changed(path: Path, text: str, mode: int) -> None:
    """Write path atomically unless it already holds text (a running job may read it)."""
    try:
        if path.read_text() == text and (path.stat().st_mode & 0o777) == mode:
            return
    except OSError:
        pass
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.chmod(temporary, mode)
    os.replace(temporary, path)
