"""A real runner (in process, real jobs, with and without bwrap): a run pip-installs into the
instance's own venv layer, a later run imports it, and snapshot_env freezes the layer."""

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
from gpulease.envs.layer import site_packages
from gpulease.runner.agent import Agent
from gpulease.runner.sandbox import find_bwrap
from processes import ENV_CACHE
from wheels import make_wheel

INSTALL = (
    "pip install --no-index --find-links . ./pkg-1.0-py3-none-any.whl extra "
    "&& echo VIRTUAL_ENV=$VIRTUAL_ENV && command -v pip"
)
IMPORT = "python -c 'import extra, pkg; print(\"imported\", pkg.VERSION, pkg.__file__)'"


class FakeServer:
    """Hands out the install run, then the import run, then the snapshot task, one after
    the other; asks the runner to stop once the task's result came."""

    def __init__(self) -> None:
        self.stdout: dict[int, str] = {1: "", 2: ""}
        self.exits: dict[int, int] = {}
        self.started: set[int] = set()
        self.result: dict[str, Any] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/runner/v1/")
        body: Any = json.loads(request.content) if request.content else None
        if path == "heartbeat":
            return httpx.Response(200, json={"action": "stop" if self.result else "continue"})
        if path == "commands":
            return self._commands()
        if path == "datasets":
            return httpx.Response(200, json={"datasets": []})
        if path.startswith("runs/"):
            run_id, call = int(path.split("/")[1]), path.split("/")[2]
            if call == "started":
                self.started.add(run_id)
            elif call == "logs":
                self.stdout[run_id] += "".join(
                    c["data"] for c in body["chunks"] if c["stream"] in ("stdout", "stderr")
                )
            elif call == "exit":
                self.exits[run_id] = body["exit_code"]
        elif path == "tasks/7/result":
            self.result = body
        return httpx.Response(204)

    def _commands(self) -> httpx.Response:
        env = {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        if 1 not in self.started:
            return httpx.Response(200, json={"runs": [{"id": 1, "command": INSTALL, "env": env}]})
        if 1 in self.exits and 2 not in self.started:
            return httpx.Response(200, json={"runs": [{"id": 2, "command": IMPORT}]})
        if 2 in self.exits and self.result is None:
            return httpx.Response(
                200, json={"runs": [], "tasks": [{"id": 7, "kind": "snapshot_env"}]}
            )
        time.sleep(0.1)
        return httpx.Response(200, json={"runs": []})


@pytest.mark.parametrize("sandbox", [False, True], ids=["unsandboxed", "sandboxed"])
def test_a_run_installs_into_the_layer_and_the_snapshot_freezes_it(
    tmp_path: Path, sandbox: bool
) -> None:
    if sandbox and find_bwrap() is None:
        pytest.skip("bubblewrap is not installed")
    template_env = ensure_env(get_template("python"), ENV_CACHE)
    run_dir, workspace = tmp_path / "run", tmp_path / "workspace"
    workspace.mkdir()
    make_wheel(workspace, "pkg", "1.0")
    make_wheel(workspace, "extra", "2.0")
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
    )
    server = FakeServer()
    agent = Agent(spec, transport=httpx.MockTransport(server), poll_wait_s=1)
    thread = threading.Thread(target=agent.serve)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()

    assert server.exits == {1: 0, 2: 0}, server.stdout
    layer = workspace / ".gpulease" / "venv"
    seen = "/workspace/.gpulease/venv" if sandbox else str(layer)
    assert f"VIRTUAL_ENV={seen}\n{seen}/bin/pip\n" in server.stdout[1]
    installed = site_packages(layer) / "pkg" / "__init__.py"
    assert installed.exists()
    assert not (site_packages(template_env) / "pkg").exists()
    inside = str(installed).replace(str(workspace), "/workspace") if sandbox else str(installed)
    assert f"imported 1.0 {inside}\n" in server.stdout[2]
    assert server.result is not None
    packages = server.result["packages"]
    assert "extra==2.0" in packages, server.result
    wheel_path = "/workspace" if sandbox else str(workspace)  # a wheel named by path
    pinned = f"pkg @ file://{wheel_path}/pkg-1.0-py3-none-any.whl#sha256="
    assert any(line.startswith(pinned) for line in packages), packages
