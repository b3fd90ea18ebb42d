"""The preemption notice: the file a preempted spot instance's jobs find before their SIGTERM.

The notice lives in the runner's SDK directory (runner/metrics.py install_sdk), which the
sandbox binds read-only: a job can read it but can neither write it nor plant a link where
the runner writes, so the runner never follows anything a job made. Jobs find it through
GPULEASE_PREEMPT_NOTICE_FILE (`gpulease.track.preempted()` reads it); it exists only from
the notice until the runner starts again. Its content is JSON: the grace in seconds and the
time (epoch seconds) by which the job must have exited.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpulease.runner.metrics import SDK_DIR
from gpulease.runner.sandbox import SDK_ROOT
from gpulease.track import PREEMPT_NOTICE_VARIABLE

NOTICE_NAME = "preempt-notice.json"


def notice_file(run_dir: Path) -> Path:
    """Where the runner writes the notice on the host."""
    return run_dir / SDK_DIR / NOTICE_NAME


def job_environment(env: dict[str, str], run_dir: Path, *, sandboxed: bool) -> dict[str, str]:
    """env plus GPULEASE_PREEMPT_NOTICE_FILE, as the job sees the path."""
    inside = f"{SDK_ROOT}/{NOTICE_NAME}" if sandboxed else str(notice_file(run_dir))
    return {**env, PREEMPT_NOTICE_VARIABLE: inside}


def clear_notice(run_dir: Path) -> None:
    """No notice: a runner starting (again, after a preemption) serves a fresh start."""
    notice_file(run_dir).unlink(missing_ok=True)


def write_notice(run_dir: Path, grace_s: float, now: float) -> Path:
    """Post the notice, all at once (a job never reads half of it). `now` is epoch seconds."""
    target = notice_file(run_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"grace_s": grace_s, "deadline": now + grace_s}).encode()
    temporary = target.with_name(f".{NOTICE_NAME}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, body)
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)
    os.replace(temporary, target)
    return target
