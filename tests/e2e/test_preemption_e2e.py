"""On a real server and runner: an on-demand request preempts a spot instance whose job
checkpoints on the notice; the spot instance is queued, starts again when GPUs free up and
its job resumes from the checkpoint; the grace is not billed and nothing twice."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from gpulease.core.money import cost_for_seconds
from processes import ADMIN_PASSWORD, BIN, Platform, running_platform

GRACE_S = 15
CHECKPOINT_S = 3  # the job's checkpoint takes this long after SIGTERM, inside the grace

JOB = f"""
import signal, sys, time
from pathlib import Path
from gpulease import track
ckpt, log = Path("ckpt.txt"), Path("log.txt")
start = int(ckpt.read_text()) if ckpt.exists() else 0
step = start
def note(text):
    with log.open("a") as f:
        f.write(text + "\\n")
def on_term(signum, frame):
    if track.preempted():
        time.sleep({CHECKPOINT_S})
        ckpt.write_text(str(step))
        note(f"checkpoint {{step}}")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
note(f"start {{start}}")
while True:
    step += 1
    time.sleep(0.01)
    if start and step >= start + 20:
        note(f"done {{step}}")
        break
"""


@pytest.fixture
def quick_grace(tmp_path: Path, database_url: str) -> Iterator[Platform]:
    if not database_url.startswith("sqlite"):
        # ~60 s a run: preemption's database side is tested on both databases in process
        # (tests/server/reconcilers/test_preemption.py)
        pytest.skip("spot preemption is tested whole-system on SQLite only")
    # sandboxed, as in production: the job keeps its grace inside bubblewrap too
    extra = {"GPULEASE_PREEMPT_GRACE_S": str(GRACE_S)}
    with running_platform(tmp_path, database_url, "A100-80GB:2", extra) as platform:
        yield platform


def _log(platform: Platform) -> str:
    return platform.cli("exec", "spot", "--", "cat log.txt 2>/dev/null || true").stdout


def _until(check: object, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_spot_preemption_checkpoints_requeues_and_resumes(quick_grace: Platform) -> None:
    platform = quick_grace
    platform.cli("login", "--server", platform.url, "--name", "admin", "--password", ADMIN_PASSWORD)
    platform.cli("admin", "grant", "admin", "20.00")
    platform.cli(
        "instance", "create", "--gpu", "A100-80GB:2", "--template", "python", "--plan", "spot",
        "--name", "spot", "--wait",
    )  # fmt: skip
    platform.cli("exec", "spot", "--", f"cat > job.py <<'EOF'\n{JOB}\nEOF")
    job = subprocess.Popen(
        [str(BIN / "gpulease"), "exec", "spot", "--", "python job.py"],
        env=platform.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _until(lambda: "start 0" in _log(platform), "the job to start")
        platform.cli(
            "instance", "create", "--gpu", "A100-80GB:1", "--template", "python", "--name", "od"
        )
        platform.wait_status("od", "running", timeout=120)
        shown = platform.wait_status("spot", "queued", timeout=60)
        assert shown["status_reason"].startswith("preempted"), shown
        job.wait(60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(10)
    # the od instance holds one of the two A100s: the spot one waits until it stops
    platform.cli("instance", "stop", "od")
    platform.wait_status("od", "stopped")
    platform.wait_status("spot", "running", timeout=120)
    _until(lambda: "done" in _log(platform), "the resumed job to finish")
    lines = _log(platform).split()
    # start 0, checkpoint N, start N, done N+20: resumed where the checkpoint left it
    assert lines[:2] == ["start", "0"] and lines[2] == "checkpoint", lines
    saved = int(lines[3])
    assert saved > 0 and lines[4:6] == ["start", str(saved)] and lines[6] == "done", lines

    usage = platform.cli_json("usage")
    ids = {i["name"]: i["id"] for i in platform.cli_json("instance", "ls")}  # type: ignore[union-attr]
    segments = [s for s in usage["segments"] if s["instance_id"] == ids["spot"]]  # type: ignore[index]
    (od_segment,) = [s for s in usage["segments"] if s["instance_id"] == ids["od"]]  # type: ignore[index]
    first, resumed = sorted(segments, key=lambda s: s["started_at"])[:2]
    ended = datetime.fromisoformat(first["ended_at"])
    # billing ended at the stop: the od instance started only after the checkpoint, and the
    # spot segment had ended that long before
    od_started = datetime.fromisoformat(od_segment["started_at"])
    assert (od_started - ended).total_seconds() >= CHECKPOINT_S - 0.5
    assert datetime.fromisoformat(resumed["started_at"]) >= ended  # no overlap: never twice
    for s in (first, od_segment):
        assert s["charged_micro"] == cost_for_seconds(s["hourly_micro"], s["billed_seconds"])
    held = (ended - datetime.fromisoformat(first["started_at"])).total_seconds()
    assert abs(first["billed_seconds"] - held) <= 1
