"""Build a template's virtual environment once, and reuse it from then on."""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gpulease.core.templates import Template

log = logging.getLogger(__name__)

COMPLETE_MARKER = ".gpulease-complete"
_TAIL_LINES = 40
# pip lines worth showing while an environment builds ("Collecting torch==2.13.0").
_PIP_PROGRESS = (
    "Collecting ",
    "Processing ",
    "Downloading ",
    "Installing collected packages",
    "Successfully",
)
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


class EnvBuildError(Exception):
    """An environment could not be built; the message says why, with the tail of pip's output."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def env_key(template: Template) -> str:
    """The directory name of a template's environment: name plus recipe hash."""
    name = _UNSAFE_NAME.sub("_", template.name) or "env"
    return f"{name}-{template.recipe_key()}"


def env_python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


def ensure_env(
    template: Template, cache_dir: Path, progress: Callable[[str], None] | None = None
) -> Path:
    """The venv for template under cache_dir, built on first use and reused afterwards.

    Safe to call from several processes at once: one builds while the others wait on a lock
    file. A directory without the completion marker is a crashed build; it is rebuilt.
    Raises EnvBuildError (with pip's output) when the build fails; exceptions raised by
    progress propagate, leaving no half-built environment marked complete.
    """
    report = progress or (lambda message: None)
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = env_key(template)
    env_dir = cache_dir / key
    if (env_dir / COMPLETE_MARKER).exists():
        return env_dir
    with _exclusive(cache_dir / f"{key}.lock", lambda: report(_waiting(template))):
        if (env_dir / COMPLETE_MARKER).exists():  # another runner built it while we waited
            return env_dir
        if env_dir.exists():
            log.warning("removing unfinished environment %s (a build crashed)", env_dir)
            report(f"removing the unfinished environment {template.name} left by a crash")
            shutil.rmtree(env_dir)
        _build(template, env_dir, report)
        (env_dir / COMPLETE_MARKER).write_text(template.recipe_key() + "\n")
    report(f"environment {template.name} is ready")
    return env_dir


def _waiting(template: Template) -> str:
    return f"waiting for another instance that is building environment {template.name}"


@contextmanager
def _exclusive(lock_path: Path, on_wait: Callable[[], None]) -> Iterator[None]:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _base_python(template: Template) -> str:
    """The interpreter to base the venv on: this one if its version fits the template."""
    current = f"{sys.version_info.major}.{sys.version_info.minor}"
    if template.python == current:
        return sys.executable
    found = shutil.which(f"python{template.python}")
    if found is None:
        raise EnvBuildError(
            f"template {template.name} needs Python {template.python}, but this host runs "
            f"Python {current} and has no python{template.python} on PATH; install it or "
            "change the template"
        )
    return found


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"):
        env.pop(name, None)
    return env


def _build(template: Template, env_dir: Path, report: Callable[[str], None]) -> None:
    steps = 2 if template.packages else 1
    name = template.name
    report(f"building environment {name}: creating a Python {template.python} venv (1/{steps})")
    _run(
        [_base_python(template), "-m", "venv", str(env_dir)],
        what=f"creating the venv for template {template.name}",
        report=None,
    )
    if not template.packages:
        return
    packages = " ".join(template.packages)
    report(f"building environment {template.name}: pip install {packages} (2/{steps})")
    _run(
        [
            str(env_python(env_dir)),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            *template.pip_options(),
            *template.packages,
        ],
        what=f"pip install {packages} for template {template.name}",
        report=report,
    )


def _run(argv: list[str], *, what: str, report: Callable[[str], None] | None) -> None:
    """Run a build step, streaming its progress lines; EnvBuildError with its tail on failure."""
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
    log.info("running %s", " ".join(argv))
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=_clean_env(),
    ) as process:
        try:
            assert process.stdout is not None
            for raw in process.stdout:
                line = raw.rstrip()
                tail.append(line)
                if report is not None and line.lstrip().startswith(_PIP_PROGRESS):
                    report(line.strip())
            code = process.wait()
        except BaseException:
            process.kill()
            raise
    if code != 0:
        output = "\n".join(tail).strip() or "(no output)"
        raise EnvBuildError(f"{what} failed with exit code {code}:\n{output}")
