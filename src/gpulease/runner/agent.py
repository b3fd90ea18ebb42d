"""The runner's life: prepare the instance, report ready, run commands, stop cleanly."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from gpulease import doctor
from gpulease.envs.build import EnvBuildError, ensure_env, env_python
from gpulease.envs.layer import ensure_layer
from gpulease.envs.snapshot import TaskRunner
from gpulease.runner import preempt, workspace_sync
from gpulease.runner.cgroups import instance_cgroup
from gpulease.runner.connection import Aborted, Connection, ServerGone, Unreachable
from gpulease.runner.datasets import DatasetError, links_dir, materialise
from gpulease.runner.jobs import LEFTOVER_GRACE_S, STOP_GRACE_S, RunProcess, run_env, stop_runs
from gpulease.runner.jupyter import JupyterLab
from gpulease.runner.logs import LogBatcher
from gpulease.runner.metrics import SDK_DIR, RunMetrics, prepare_run, sample_gpus, send_metrics
from gpulease.runner.netns import InstanceNetwork, NetworkError
from gpulease.runner.sandbox import (
    Sandbox,
    SandboxError,
    base_environment,
    find_bwrap,
    instance_uid,
    probe,
    resolve_gpus,
)
from gpulease.runner.streams import ShellSetup, Streams, shell_environment
from gpulease.runner.workdir import UnsafeArchive, extract_workdir
from gpulease.runner.workspace_sync import WorkspaceSyncError
from gpulease.schemas.runner import (
    RUNNER_API,
    RunnerAction,
    RunnerCommands,
    RunnerExit,
    RunnerFailed,
    RunnerHeartbeat,
    RunnerLogs,
    RunnerReady,
    RunnerRun,
    RunnerSpec,
    RunnerStarted,
    RunnerStatus,
)

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.2
# How often a run's reporter, with no output to send, looks whether its process finished
# (its end and new output wake it at once).
QUIET_RECHECK_S = 1.0
POLL_WAIT_S = 20
WORKDIR_MARKER = workspace_sync.WORKDIR_MARKER
_MAX_REASON = 8000
_MAX_STATUS = 2000
# Once told to stop, how long the runner keeps trying to report to a server that is away.
SHUTDOWN_REPORT_S = 60.0


class StopRequested(Exception):
    """The runner was told to stop (SIGTERM, heartbeat, 409) before the instance was ready."""


@dataclass
class _Run:
    process: RunProcess
    reporter: threading.Thread | None = None
    reported: bool = False  # exit acknowledged, or nobody left to tell
    metrics: RunMetrics | None = None


class Agent:
    """One runner serving one instance, as docs/runner-protocol.md describes.

    serve() returns the process exit code: 0 after a stop (also when the instance was
    released), 1 when the instance cannot be served (the server was told why with /failed).
    """

    def __init__(
        self,
        spec: RunnerSpec,
        *,
        transport: httpx.BaseTransport | None = None,
        stop_grace_s: float = STOP_GRACE_S,
        leftover_grace_s: float = LEFTOVER_GRACE_S,
        poll_wait_s: int = POLL_WAIT_S,
    ) -> None:
        self.spec = spec
        self._stop_grace = stop_grace_s
        self._leftover_grace = leftover_grace_s
        self._poll_wait = poll_wait_s
        self._stopping = threading.Event()
        self._finished = threading.Event()
        # Set when the stop is a preemption: the jobs get the notice and this long after it.
        self._preempt_grace: float | None = None
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()  # one workspace save at a time (workspace_sync)
        self._accepting = True
        self._runs: dict[int, _Run] = {}
        self._env_dir = Path()  # the template's shared venv, read-only in the sandbox
        self._layer_dir = Path()  # the instance's own venv on top of it (envs/layer.py)
        self._tasks: TaskRunner | None = None
        self._sandbox: Sandbox | None = None
        # Mounted datasets: name -> read-only host directory (runner/datasets.py).
        self.dataset_dirs: dict[str, Path] = {}
        # Terminal and JupyterLab streams the server asks for (runner/streams.py).
        self._streams: Streams | None = None
        self._jupyter: JupyterLab | None = None
        self.connection = Connection(
            spec.server_url,
            spec.token,
            on_stop=self.request_stop,
            transport=transport,
            server_certificate=spec.server_certificate,
            server_socket=spec.server_socket,
        )

    def request_stop(self, reason: str) -> None:
        """Stop all runs and exit; safe from any thread and from a signal handler."""
        if not self._stopping.is_set():
            log.info("stopping: %s", reason)
            self._stopping.set()

    def _stop_asked(self, preempt_grace_s: float | None) -> None:
        """The server asked to stop (heartbeat or long poll); with a grace, as a preemption."""
        if preempt_grace_s is not None and not self._stopping.is_set():
            self._preempt_grace = preempt_grace_s
            self.request_stop(f"preempted: the jobs get {preempt_grace_s:.0f} s to checkpoint")
        self.request_stop("the server asked to stop")

    def serve(self) -> int:
        try:
            return self._serve()
        except Exception as exc:
            log.exception("the runner crashed")
            self._stop_all()
            return self._fail(f"the runner crashed: {type(exc).__name__}: {exc}")
        finally:
            self._finished.set()
            self.connection.close()

    def _serve(self) -> int:
        preempt.clear_notice(self.spec.run_dir)  # a start after a preemption is a fresh one
        try:
            # First of all: the spec's launch secret is replaced by a token only this
            # process holds (runner/connection.py).
            self.connection.open_session(abort=self._stopping)
            self._env_dir = self._prepare()
            response = self.connection.call(
                "POST",
                f"{RUNNER_API}/ready",
                json=_body(RunnerReady(pid=os.getpid(), python=str(env_python(self._env_dir)))),
                abort=self._stopping,
            )
        except (ServerGone, StopRequested, Aborted) as exc:
            log.info("not serving the instance: %s", exc or type(exc).__name__)
            return self._stopped()
        except (
            EnvBuildError,
            UnsafeArchive,
            SandboxError,
            DatasetError,
            WorkspaceSyncError,
        ) as exc:
            return self._fail(exc.message)
        if response.status_code == 409 or self._stopping.is_set():
            return self._shutdown()
        if not response.is_success:
            return self._fail(f"the server refused ready with HTTP {response.status_code}")
        log.info("instance %d is ready", self.spec.instance_id)
        self._open_streams()
        for target in (self._heartbeats, self._poll_commands):
            threading.Thread(target=self._forever, args=(target,), daemon=True).start()
        if self.spec.workspace_save and self.spec.workspace_save_interval_s > 0:
            threading.Thread(target=self._forever, args=(self._save_often,), daemon=True).start()
        threading.Thread(
            target=sample_gpus,
            args=(
                self.connection,
                self.spec.gpu_uuids,
                self.spec.gpu_sample_interval_s,
                self._finished,
            ),
            name="gpu-samples",
            daemon=True,
        ).start()
        while not self._stopping.wait(0.5):
            pass
        return self._shutdown()

    def _forever(self, loop: Callable[[], None]) -> None:
        """Keep a background loop going through unexpected errors until the runner exits."""
        while not self._finished.is_set():
            try:
                loop()
                return
            except Exception:
                if self._finished.is_set():
                    return
                log.exception("%s failed; restarting it", loop.__name__)
                self._finished.wait(1.0)

    # -- preparing ---------------------------------------------------------------------------

    def _prepare(self) -> Path:
        template = self.spec.template
        if self.spec.sandbox:
            self._status("checking the sandbox")
            reason = probe()
            if reason is not None:
                raise SandboxError(f"jobs cannot be sandboxed on this node: {reason}")
        self._status(f"preparing environment {template.name}")
        env_dir = ensure_env(template, self.spec.env_cache, self._status)
        self._status("preparing the workspace")
        workspace_sync.restore(self.spec, self.connection, self._status)  # it ran elsewhere
        self._fetch_workdir()
        doctor.install(self.spec.run_dir / SDK_DIR)  # `python -m gpulease.doctor` in runs
        self.dataset_dirs = materialise(self.spec, self.connection, self._status)
        self._env_dir = env_dir
        with self._lock:
            jail = self._run_sandbox()
        if jail is not None and jail.network is not None:  # a rank's fabric, too: fail here
            try:
                jail.network.ensure()
            except NetworkError as exc:
                raise SandboxError(f"the instance's network: {exc.message}") from exc
        # made in the sandbox as the job: the layer is the job's to write (envs/layer.py)
        self._layer_dir = ensure_layer(env_dir, self.spec.workspace, sandbox=jail)
        self._check_stop()
        return env_dir

    def _check_stop(self) -> None:
        if self._stopping.is_set():
            raise StopRequested("asked to stop while preparing")

    def _status(self, message: str) -> None:
        """Progress shown to the user; best effort, a lost message is not retried."""
        self._check_stop()
        try:
            self.connection.call(
                "POST",
                f"{RUNNER_API}/status",
                json=_body(RunnerStatus(message=message[:_MAX_STATUS])),
                retry=False,
                timeout=5,
            )
        except Unreachable as exc:
            log.warning("progress %r not delivered: %s", message, exc)
        self._check_stop()

    def _fetch_workdir(self) -> None:
        """Extract the uploaded workdir into the workspace, once per instance: after a
        stop/start the workspace holds the user's newer files."""
        workspace = self.spec.workspace
        workspace.mkdir(parents=True, exist_ok=True)
        run_dir = self.spec.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        marker = run_dir / WORKDIR_MARKER
        if marker.exists():
            return
        archive = run_dir / "workdir.tar"
        try:
            response = self.connection.call(
                "GET",
                f"{RUNNER_API}/workdir",
                download_to=archive,
                timeout=300,
                abort=self._stopping,
            )
            if response.status_code == 200:
                count = extract_workdir(archive, workspace)
                log.info("extracted %d workdir files into %s", count, workspace)
            elif response.status_code != 204:
                self._check_stop()
                raise UnsafeArchive(
                    f"the workdir could not be fetched: HTTP {response.status_code}: "
                    + _server_says(response)
                )
        finally:
            archive.unlink(missing_ok=True)
        marker.write_text("")

    # -- running ---------------------------------------------------------------------------

    def _heartbeats(self) -> None:
        """Until the runner exits, also while stopping: the server sees it is still there."""
        unreachable = False
        while not self._finished.is_set():
            running = self._running_ids()
            try:
                response = self.connection.call(
                    "POST",
                    f"{RUNNER_API}/heartbeat",
                    json=_body(RunnerHeartbeat(running_runs=running)),
                    retry=False,
                    timeout=10,
                )
            except ServerGone:
                return
            except Unreachable as exc:
                if not unreachable:
                    log.warning("heartbeat not delivered: %s", exc)
                unreachable = True
            else:
                if unreachable and response.status_code == 200:
                    # The server is back (it restarted, or the path was cut): a new session,
                    # so that a token that could have leaked meanwhile is worth nothing.
                    try:
                        self.connection.open_session(abort=self._stopping)
                    except ServerGone:
                        return
                    except Aborted:
                        pass
                unreachable = False
                action = _answer(response, RunnerAction) if response.status_code == 200 else None
                if action is not None and action.action == "stop":
                    self._stop_asked(action.preempt_grace_s)
            self._finished.wait(self.spec.heartbeat_interval_s)

    def _save_often(self) -> None:
        """While the instance runs, save its workspace every workspace_save_interval_s at
        the lowest priority (only what changed: workspace_sync's index), so that a node
        that dies leaves a recent copy; a stop cuts the save short and saves the rest."""
        workspace_sync.lower_priority()  # this thread only
        while not self._stopping.wait(self.spec.workspace_save_interval_s):
            with self._save_lock:
                try:
                    workspace_sync.save(self.spec, self.connection, abort=self._stopping)
                except (WorkspaceSyncError, OSError, Unreachable, ServerGone, Aborted) as exc:
                    log.warning("the workspace's periodic save did not finish: %s", exc)

    def _running_ids(self) -> list[int]:
        with self._lock:
            return sorted(run_id for run_id, run in self._runs.items() if not run.reported)

    def _poll_commands(self) -> None:
        while not self._stopping.is_set():
            asked = time.monotonic()
            try:
                response = self.connection.call(
                    "GET",
                    f"{RUNNER_API}/commands",
                    params={"wait": self._poll_wait},
                    timeout=self._poll_wait + 15,
                    abort=self._stopping,
                )
            except (ServerGone, Aborted):
                return
            commands = _answer(response, RunnerCommands) if response.status_code == 200 else None
            if commands is not None and commands.stop:
                self._stop_asked(commands.preempt_grace_s)
                return
            if commands is not None:
                for run in commands.runs:
                    self._start_run(run)
                if self._streams is not None:
                    self._streams.handle(commands.streams)
                if self._tasks is None:  # snapshot_env (envs/snapshot.py)
                    self._tasks = TaskRunner(
                        self.connection,
                        self._layer_dir,
                        RUNNER_API,
                        sandbox=self._run_sandbox,  # made in _prepare
                    )
                self._tasks.handle([task.model_dump() for task in commands.tasks])
            elif not self._stopping.is_set():
                self._stopping.wait(1.0)
            idle = commands is None or not (commands.runs or commands.streams or commands.tasks)
            if idle and time.monotonic() - asked < FLUSH_INTERVAL_S:  # nothing, at once
                self._stopping.wait(FLUSH_INTERVAL_S)

    def _start_run(self, run: RunnerRun) -> None:
        run_id, command, extra = run.id, run.command, run.env
        with self._lock:
            if not self._accepting or run_id in self._runs:
                return
            jail = self._run_sandbox()
            env = run_env(
                self.spec,
                self._env_dir,
                run_id,
                extra,
                base=base_environment(os.environ) if jail else None,
                datasets_dir=self._datasets_dir(jail is not None),
                layer=self._layer_dir,
            )
            env, jail, metrics = prepare_run(
                self.spec.run_dir, self.spec.workspace, run_id, env, jail
            )
            env = preempt.job_environment(env, self.spec.run_dir, sandboxed=jail is not None)
            process = RunProcess(
                run_id,
                command,
                env=jail.environment(env) if jail else env,
                cwd=self.spec.workspace,
                batcher=LogBatcher(),
                leftover_grace_s=self._leftover_grace,
                sandbox=jail,
                on_output=metrics.on_output,
            )
            process.start()
            started = _Run(process, metrics=metrics)
            started.reporter = threading.Thread(
                target=self._report, args=(started,), name=f"run-{run_id}-report", daemon=True
            )
            self._runs[run_id] = started
            started.reporter.start()

    def _datasets_dir(self, sandboxed: bool) -> str | None:
        """GPULEASE_DATASETS_DIR: /data in the sandbox, the directory of links outside it."""
        if not self.dataset_dirs:
            return None
        return "/data" if sandboxed else str(links_dir(self.spec))

    def _run_sandbox(self) -> Sandbox | None:
        """The sandbox runs go into (None when the server runs unsandboxed), made at the
        first run: the datasets are materialised by then."""
        if not self.spec.sandbox:
            return None
        if self._sandbox is None:
            self._sandbox = Sandbox(
                workspace=self.spec.workspace,
                env_dir=self._env_dir,
                hostname=f"gpulease-{self.spec.instance_id}",
                datasets=dict(self.dataset_dirs),
                gpus=tuple(resolve_gpus(self.spec.gpu_indices)),
                private=(self.spec.run_dir,),
                bwrap=find_bwrap() or "bwrap",
                uid=self.spec.sandbox_uid or instance_uid(self.spec.instance_id),
                network=InstanceNetwork(f"i{self.spec.instance_id}", fabric=self.spec.fabric),
                cgroup=instance_cgroup(
                    self.spec.instance_id,
                    self.spec.run_dir,
                    vcpus=self.spec.vcpus,
                    memory_bytes=self.spec.memory_bytes,
                    gpus=len(self.spec.gpu_uuids),
                    node_gpus=self.spec.node_gpus,
                ),
            )
        return self._sandbox

    # -- terminal and JupyterLab (runner/streams.py, runner/jupyter.py) -----------------------

    def _open_streams(self) -> None:
        self._jupyter = JupyterLab(
            run_dir=self.spec.run_dir,
            env_cache=self.spec.env_cache,
            base_url=f"/instances/{self.spec.instance_id}/jupyter/",
            shell=self._jupyter_shell,
            stopping=self._stopping,
        )
        self._streams = Streams(
            self.spec.server_url,
            lambda: self.connection.token,
            shell=self._shell,
            jupyter=self._jupyter.ensure,
            server_certificate=self.spec.server_certificate,
            server_socket=self.spec.server_socket,
        )

    def _shell(self) -> ShellSetup:
        """How a terminal starts: a run's environment and sandbox, without a run id."""
        with self._lock:
            jail = self._run_sandbox()
        env = run_env(
            self.spec,
            self._env_dir,
            0,
            {},
            base=base_environment(os.environ) if jail else None,
            datasets_dir=self._datasets_dir(jail is not None),
            layer=self._layer_dir,
        )
        return ShellSetup(shell_environment(env, jail), str(self.spec.workspace), jail)

    def _jupyter_shell(self) -> tuple[dict[str, str], str, Sandbox | None, Path]:
        """A terminal's setup and the venv notebook kernels run on: the instance's layer, as
        the sandbox sees it when there is one."""
        setup = self._shell()
        layer = Path(setup.sandbox.inside(self._layer_dir)) if setup.sandbox else self._layer_dir
        return dict(setup.env), setup.cwd, setup.sandbox, layer

    def _close_streams(self) -> None:
        if self._streams is not None:
            self._streams.close()
        if self._jupyter is not None:
            self._jupyter.stop()

    def _report(self, run: _Run) -> None:
        """started, then log chunks as they come, then exit once every chunk is acknowledged."""
        process = run.process
        batcher = process.batcher
        path = f"{RUNNER_API}/runs/{process.run_id}"
        try:
            self.connection.call(
                "POST", f"{path}/started", json=_body(RunnerStarted(pid=process.pid))
            )
            metrics = threading.Thread(
                target=send_metrics,
                args=(self.connection, process.run_id, run.metrics),
                name=f"run-{process.run_id}-metrics",
                daemon=True,
            )
            if run.metrics is not None:
                metrics.start()
            while True:
                finished = process.finished
                batcher.seal()
                sent = False
                while chunks := batcher.unacked():
                    body = _body(RunnerLogs(chunks=chunks))
                    self.connection.call("POST", f"{path}/logs", json=body)
                    batcher.ack(chunks)
                    sent = True
                if finished:
                    break
                if sent:  # output is flowing: gather FLUSH_INTERVAL_S of it per post
                    batcher.wait(FLUSH_INTERVAL_S)
                else:  # quiet until now: the first new output goes at once
                    batcher.wait_for_output(QUIET_RECHECK_S)
            if run.metrics is not None:  # every point is sent before the exit
                run.metrics.close()
                metrics.join()
            exit_code = process.exit_code
            assert exit_code is not None  # the process has finished
            self.connection.call(
                "POST", f"{path}/exit", json=_body(RunnerExit(exit_code=exit_code))
            )
            log.info("run %d: exit %s reported", process.run_id, process.exit_code)
        except ServerGone:
            log.info("run %d: the server is gone; its report is dropped", process.run_id)
        except Exception:
            log.exception("reporting run %d failed", process.run_id)
        finally:
            with self._lock:
                run.reported = True

    # -- stopping ----------------------------------------------------------------------------

    def _shutdown(self) -> int:
        runs = self._stop_all()
        deadline = time.monotonic() + SHUTDOWN_REPORT_S
        for run in runs:
            if run.reporter is not None:
                # logs and exits wait for the server, but not forever once we are stopping
                run.reporter.join(max(0.0, deadline - time.monotonic()))
        try:  # a fleet node's workspace goes to the server, in case it starts elsewhere next
            if self.spec.workspace_save:  # billing ends; no grace cuts the save
                with contextlib.suppress(Unreachable):  # unheard, the grace still bounds it
                    workspace_sync.saving(self.connection)
            with self._save_lock:  # a periodic save stops at its next pack
                workspace_sync.save(self.spec, self.connection)
        except (WorkspaceSyncError, OSError, Unreachable, ServerGone, Aborted) as exc:
            log.error("the workspace was not saved to the server: %s", exc)
        return self._stopped()

    def _stop_all(self) -> list[_Run]:
        """Refuse new runs, close the streams, stop every run and the sandbox; the runs."""
        with self._lock:
            self._accepting = False
            runs = list(self._runs.values())
        self._close_streams()
        grace = self._stop_grace
        if self._preempt_grace is not None:
            # the notice first: a job that checks preempted() on SIGTERM finds it
            preempt.write_notice(self.spec.run_dir, self._preempt_grace, time.time())
            grace = self._preempt_grace
        stop_runs([run.process for run in runs], grace)
        if self._sandbox is not None:
            self._sandbox.close()  # the instance's network goes with its last process
        return runs

    def _stopped(self) -> int:
        if self.connection.gone.is_set():
            return 0  # nobody to tell
        # Bounded: a server that stays away finds the runner gone and stops the instance
        # itself, so the runner never outlives its stop by more than this.
        with contextlib.suppress(ServerGone, Unreachable):
            self.connection.call(
                "POST", f"{RUNNER_API}/stopped", json={}, give_up_after=SHUTDOWN_REPORT_S
            )
        log.info("stopped")
        return 0

    def _fail(self, reason: str) -> int:
        log.error("cannot serve instance %d: %s", self.spec.instance_id, reason)
        with contextlib.suppress(ServerGone, Aborted):
            self.connection.call(
                "POST",
                f"{RUNNER_API}/failed",
                json=_body(RunnerFailed(reason=reason[:_MAX_REASON])),
                abort=self._stopping,
            )
        return 1


def _body(model: BaseModel) -> Any:
    """A protocol body as JSON (schemas/runner.py)."""
    return model.model_dump(mode="json")


_M = TypeVar("_M", bound=BaseModel)


def _answer(response: httpx.Response, model: type[_M]) -> _M | None:
    """The server's answer read as model, or None (logged) when it is not one."""
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        log.error("ignoring a malformed answer to %s: %s", response.request.url.path, exc)
        return None


def _server_says(response: httpx.Response) -> str:
    """The `detail` of the server's refusal, else the start of its body."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail)[:500] if detail else response.text[:500]


def serve(spec: RunnerSpec) -> int:
    """Run an agent for spec in this process, stopping it on SIGTERM or SIGINT."""
    agent = Agent(spec)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        agent.request_stop(f"got {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return agent.serve()
