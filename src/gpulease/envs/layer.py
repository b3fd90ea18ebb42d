"""An instance's writable venv layer on its template's shared, read-only venv."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from gpulease.envs.build import EnvBuildError, env_python
from gpulease.runner import safefs
from gpulease.runner.oneoff import Executor, in_sandbox, on_host
from gpulease.runner.sandbox import Sandbox, SandboxError, venv_home

log = logging.getLogger(__name__)

LAYER_DIR = Path(".gpulease") / "venv"
PTH_NAME = "_gpulease_template.pth"
SHIM = '#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n'
VENV_TIMEOUT_S = 120.0
_CFG_LIMIT = 64 * 1024

# Run by the template's python (-I: no environment variables, no user site, not the
# working directory on sys.path) where the layer's jobs run: in the sandbox, as the job.
# argv: layer, template's pyvenv.cfg home, template site-packages, .pth name, shim text.
# Everything it touches is the job's own; it (re)points the layer only when the template's
# Python moved, keeping the layer's packages, and rewrites the .pth file and the pip shims
# only when they changed (a running job may read them).
_LAYER_SCRIPT = r"""
import glob, os, sys, venv
layer, home, template_site, pth_name, shim = sys.argv[1:6]

def layer_home():
    try:
        with open(os.path.join(layer, "pyvenv.cfg"), errors="replace") as cfg:
            text = cfg.read(65536)
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "home":
            return value.strip()
    return None

def write(path, text, mode):
    try:
        with open(path) as old:
            same = old.read(len(text) + 1) == text
        if same and os.stat(path).st_mode & 0o777 == mode:
            return
    except OSError:
        pass
    temporary = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    try:
        os.unlink(temporary)
    except FileNotFoundError:
        pass
    with open(temporary, "x") as out:
        out.write(text)
    os.chmod(temporary, mode)
    os.replace(temporary, path)

def links_where_venv_writes():
    names = ["pyvenv.cfg"]
    bin_dir = os.path.join(layer, "bin")
    if os.path.isdir(bin_dir) and not os.path.islink(bin_dir):
        names += [os.path.join("bin", n) for n in os.listdir(bin_dir)
                  if n.lower().startswith("activate")]
    return [p for p in (os.path.join(layer, n) for n in names) if os.path.islink(p)]

if layer_home() != home:
    upgrade = os.path.lexists(os.path.join(layer, "pyvenv.cfg"))
    # links where venv writes (the job's own doing) would only make it fail: drop them
    for path in links_where_venv_writes():
        os.unlink(path)
    os.makedirs(os.path.dirname(layer), exist_ok=True)
    venv.EnvBuilder(symlinks=True, with_pip=False, upgrade=upgrade).create(layer)
found = sorted(glob.glob(os.path.join(layer, "lib", "python3*", "site-packages")))
if not found:
    sys.exit("the layer venv has no site-packages")
pth = "import site; site.addsitedir(%r)\n" % template_site
write(os.path.join(found[0], pth_name), pth, 0o644)
for name in ("pip", "pip3"):
    write(os.path.join(layer, "bin", name), shim, 0o755)
"""


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


def where(sandbox: Sandbox | None, path: Path) -> tuple[Executor, Path]:
    """How the runner's own commands on a job's venv run (here and envs/snapshot.py), and
    the host path as they see it: in sandbox (a workspace path under /workspace), or on
    the host when there is none."""
    if sandbox is None:
        return on_host, path
    return in_sandbox(sandbox), Path(sandbox.inside(path))


def ensure_layer(
    template_env: Path,
    workspace: Path,
    *,
    sandbox: Sandbox | None = None,
) -> Path:
    """The instance's layer venv (workspace/.gpulease/venv, a host path), created on first
    use with the template's Python; the template venv is never written to.

    Every call (idempotent) rewrites what ties the layer to the template: a .pth file that
    adds the template's site-packages after the layer's own (template packages import and
    count as installed for pip; packages installed in the layer win), and `pip`/`pip3`
    shims that run `python -m pip` with the layer's python, so `pip install X` installs
    into the layer. The layer names the template by its host path, which is also its path
    inside the sandbox.

    The layer is the job's: all of that is done by a script run where the job's runs run,
    as the job (in the instance's sandbox, where the layer is /workspace/.gpulease/venv),
    so no link or file the job planted there can make the runner write anywhere. Without
    a sandbox the jobs run on the host as the runner does, and so does the script; the
    layer's directories must still be real ones in the workspace. Raises EnvBuildError
    with a reason when the venv cannot be made.
    """
    layer = layer_dir(workspace)
    execute, inside = where(sandbox, layer)
    if sandbox is None:
        _check_real_directories(workspace)
    home = venv_home(template_env)
    argv = [
        str(env_python(template_env)),
        "-I",
        "-c",
        _LAYER_SCRIPT,
        str(inside),
        home or "",
        str(site_packages(template_env)),
        PTH_NAME,
        SHIM,
    ]
    try:
        outcome = execute(argv, {"PATH": "/usr/bin:/bin"}, VENV_TIMEOUT_S)
    except (OSError, SandboxError) as exc:
        raise EnvBuildError(f"the instance's venv could not be created: {exc}") from exc
    if outcome.returncode is None:
        raise EnvBuildError(
            f"the instance's venv could not be created in {VENV_TIMEOUT_S:.0f} s; remove "
            f"{LAYER_DIR} from the workspace and start the instance again"
        )
    if outcome.returncode != 0:
        raise EnvBuildError(
            f"the instance's venv could not be created (exit code {outcome.returncode}): "
            f"{outcome.error_tail()}"
        )
    log.info("instance venv ready: %s", layer)
    return layer


def _check_real_directories(workspace: Path) -> None:
    """The workspace is the renter's: a link in the layer's path must not make a host-side
    venv write elsewhere, nor may pyvenv.cfg be anything but a file."""
    workspace.mkdir(parents=True, exist_ok=True)
    try:
        safefs.makedirs(workspace, LAYER_DIR.parent)
        with contextlib.suppress(FileNotFoundError):
            os.close(safefs.open_file(workspace, LAYER_DIR / "pyvenv.cfg"))
    except safefs.UnsafePath as exc:
        raise EnvBuildError(
            f"{LAYER_DIR} in the workspace links outside it or holds a special file "
            f"({exc.message}); remove {LAYER_DIR} from the workspace and start the "
            "instance again"
        ) from exc
