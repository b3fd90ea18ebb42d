"""A preempted runner: the job finds the notice (gpulease.track.preempted()) on its SIGTERM
and gets the grace to checkpoint; an ordinary stop posts no notice and gives the usual
grace only."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from gpulease import track
from gpulease.backends.base import RunnerSpec
from gpulease.core.templates import get_template
from gpulease.runner import preempt
from gpulease.runner.agent import Agent, _Run
from gpulease.runner.sandbox import SDK_ROOT, find_bwrap, probe
from gpulease.schemas.runner import RunnerRun

# On SIGTERM: write whether the notice is there, take 1.5 s to "checkpoint", exit 0.
JOB = """
import signal, sys, time
from pathlib import Path
from gpulease import track
def on_term(signum, frame):
    Path("checkpoint.txt").write_text(f"preempted={track.preempted()}")
    time.sleep(1.5)
    Path("checkpoint.txt").write_text(f"preempted={track.preempted()} saved")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
Path("started.txt").write_text(str(track.preempted()))
while True:
    time.sleep(0.05)
"""


def _agent(tmp_path: Path, *, sandbox: bool = False, run_dir: Path | None = None) -> Agent:
    (tmp_path / "job.py").write_text(JOB)
    spec = RunnerSpec(
        instance_id=7,
        server_url="http://127.0.0.1:1",
        token="launch-secret",
        workspace=tmp_path,
        run_dir=run_dir or tmp_path / "run",
        env_cache=tmp_path / "envs",
        template=get_template("python"),
        sandbox=sandbox,
        vcpus=1.0 if sandbox else None,
        memory_bytes=2**30 if sandbox else None,
    )
    server = httpx.MockTransport(lambda request: httpx.Response(204))
    agent = Agent(spec, transport=server, stop_grace_s=0.5, leftover_grace_s=0.2)
    if sandbox:  # this venv as the template's and the layer's: the sandbox binds it read-only
        agent._env_dir = agent._layer_dir = Path(sys.prefix)
    return agent


def _run_until_started(agent: Agent, tmp_path: Path, python: str = sys.executable) -> None:
    agent._start_run(RunnerRun(id=1, command=f"{python} job.py"))
    started = tmp_path / "started.txt"
    deadline = time.monotonic() + 20
    while not (started.exists() and started.read_text()):  # created, then written
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.05)
    assert started.read_text() == "False"  # no notice before one is sent


def _exit_code(run: _Run) -> int | None:
    """The run's exit code, which its watcher records a moment after its process group went."""
    deadline = time.monotonic() + 10
    while not run.process.finished and time.monotonic() < deadline:
        time.sleep(0.02)
    return run.process.exit_code


# The preemption's grace: far beyond the job's 1.5 s checkpoint, so that a loaded host (a
# test suite on two workers beside it) does not make the job overrun it.
PREEMPT_GRACE_S = 20.0


def _preempt_and_see_it_saved(agent: Agent, workspace: Path) -> None:
    agent._stop_asked(PREEMPT_GRACE_S)
    started = time.monotonic()
    (run,) = agent._stop_all()
    took = time.monotonic() - started
    # the checkpoint took longer than an ordinary stop's grace and was not cut short
    assert (workspace / "checkpoint.txt").read_text() == "preempted=True saved"
    # the job exited by itself once saved; the run still reads as stopped by its SIGTERM
    assert _exit_code(run) == -15 and 1.4 < took < PREEMPT_GRACE_S


def test_a_preempted_job_sees_the_notice_and_gets_the_grace(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    _run_until_started(agent, tmp_path)
    _preempt_and_see_it_saved(agent, tmp_path)
    notice = json.loads(preempt.notice_file(tmp_path / "run").read_text())
    assert notice["grace_s"] == PREEMPT_GRACE_S and notice["deadline"] > time.time()
    # a runner starting again clears the notice
    preempt.clear_notice(tmp_path / "run")
    assert not preempt.notice_file(tmp_path / "run").exists()


@pytest.mark.skipif(find_bwrap() is None or probe() is not None, reason="no sandbox here")
def test_a_sandboxed_job_keeps_its_grace_after_the_thread_that_started_it_returns(
    tmp_path: Path,
) -> None:
    # Runs start from the loop that polls the server, which returns when told to stop.
    # bwrap's --die-with-parent fires when the thread that forked it ends: a run forked
    # there was SIGKILLed at once, before its checkpoint.
    workspace = tmp_path / "workspace"  # the runner's files must lie outside it
    workspace.mkdir()
    agent = _agent(workspace, sandbox=True, run_dir=tmp_path / "run")
    poller = threading.Thread(target=_run_until_started, args=(agent, workspace, "python"))
    poller.start()
    poller.join()
    assert (workspace / "started.txt").exists()
    _preempt_and_see_it_saved(agent, workspace)


def test_an_ordinary_stop_posts_no_notice_and_keeps_its_grace(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    _run_until_started(agent, tmp_path)
    agent._stop_asked(None)
    (run,) = agent._stop_all()
    assert (tmp_path / "checkpoint.txt").read_text() == "preempted=False"
    assert _exit_code(run) == -9  # killed after the 0.5 s stop grace
    assert not preempt.notice_file(tmp_path / "run").exists()


def test_the_notice_path_a_job_sees(tmp_path: Path) -> None:
    env = preempt.job_environment({}, tmp_path, sandboxed=True)
    # the SDK directory, which the sandbox binds read-only: a job cannot plant a link there
    assert env[track.PREEMPT_NOTICE_VARIABLE] == f"{SDK_ROOT}/{preempt.NOTICE_NAME}"
    env = preempt.job_environment({}, tmp_path, sandboxed=False)
    assert env[track.PREEMPT_NOTICE_VARIABLE] == str(preempt.notice_file(tmp_path))


def test_track_preempted_outside_gpulease_is_false(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(track.PREEMPT_NOTICE_VARIABLE, raising=False)
    assert track.preempted() is False
    monkeypatch.setenv(track.PREEMPT_NOTICE_VARIABLE, str(tmp_path / "notice"))
    assert track.preempted() is False
    (tmp_path / "notice").write_text("{}")
    assert track.preempted() is True
