"""A real runner (in process, real jobs, with and without bwrap) sends a run's metric points
from the SDK and stdout, all of them before the run's exit."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulease.backends.base import RunnerSpec
from gpulease.core.templates import get_template
from gpulease.envs.build import ensure_env
from gpulease.runner.agent import Agent
from gpulease.runner.sandbox import find_bwrap
from processes import ENV_CACHE

JOB = """
import os
from gpulease import track
for i in range(3):
    track.log(step=i, loss=1 / (i + 1))
    print(f"step={i} acc={i / 10!r}")
print("metrics_file", os.environ["GPULEASE_METRICS_FILE"])
print("run_dir_visible", os.path.exists(RUN_DIR))
try:
    open(track.__file__, "a").close()
    print("sdk_writable True")
except OSError:
    print("sdk_writable False")
"""


class FakeServer:
    """Answers the runner protocol; one run; asks the runner to stop once its exit came."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.points: list[dict[str, Any]] = []
        self.stdout = ""
        self.exit_code: int | None = None
        self.started = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/runner/v1/")
        self.paths.append(path)
        body = json.loads(request.content) if request.content else None
        if path == "heartbeat":
            return httpx.Response(
                200, json={"action": "stop" if self.exit_code is not None else "continue"}
            )
        if path == "commands":
            if self.started:
                time.sleep(0.1)
                return httpx.Response(200, json={"runs": []})
            return httpx.Response(200, json={"runs": [{"id": 5, "command": "python job.py"}]})
        if path == "datasets":
            return httpx.Response(200, json={"datasets": []})
        if path == "runs/5/started":
            self.started = True
        elif path == "runs/5/logs":
            self.stdout += "".join(c["data"] for c in body["chunks"] if c["stream"] == "stdout")
        elif path == "runs/5/metrics":
            self.points += body["points"]
        elif path == "runs/5/exit":
            self.exit_code = body["exit_code"]
        return httpx.Response(204)


@pytest.mark.parametrize("sandbox", [False, True], ids=["unsandboxed", "sandboxed"])
def test_a_run_sends_its_points_before_its_exit(tmp_path: Path, sandbox: bool) -> None:
    if sandbox and find_bwrap() is None:
        pytest.skip("bubblewrap is not installed")
    ensure_env(get_template("python"), ENV_CACHE)
    run_dir, workspace = tmp_path / "run", tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "job.py").write_text(f"RUN_DIR = {str(run_dir)!r}\n{JOB}")
    spec = RunnerSpec(
        instance_id=9,
        server_url="http://server.test",
        token="t",
        workspace=workspace,
        run_dir=run_dir,
        env_cache=ENV_CACHE,
        template=get_template("python"),
        heartbeat_interval_s=0.2,
        sandbox=sandbox,
        gpu_uuids=("SIM-T4-0",),  # simulated: never sampled
    )
    server = FakeServer()
    agent = Agent(spec, transport=httpx.MockTransport(server), poll_wait_s=1)
    thread = threading.Thread(target=agent.serve)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()

    assert server.exit_code == 0, server.stdout
    paths = server.paths
    last_points = max(i for i, p in enumerate(paths) if p == "runs/5/metrics")
    assert last_points < paths.index("runs/5/exit")
    assert "gpu-samples" not in paths
    got = {(p["source"], p["key"], p["step"]): p["value"] for p in server.points}
    assert got == {
        **{("sdk", "loss", i): 1 / (i + 1) for i in range(3)},
        **{("stdout", "acc", i): i / 10 for i in range(3)},
    }
    metrics_file = "/opt/gpulease/metrics" if sandbox else str(run_dir / "metrics" / "5")
    assert f"metrics_file {metrics_file}/sdk.jsonl\n" in server.stdout
    if sandbox:  # the job sees the SDK and its own metrics file, nothing else of the runner's
        assert "run_dir_visible False\n" in server.stdout
        assert "sdk_writable False\n" in server.stdout
