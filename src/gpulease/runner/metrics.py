"""A run's metric points from its three sources (SDK file, stdout, TensorBoard), sent in batches.

The SDK (`gpulease.track`) appends JSON lines to the run's metrics file; `key=value` lines on
stdout are parsed as they are read; TensorBoard event files under the workspace's `runs/`
are read as they grow. Points are batched (about every 0.5 s, or sooner at 1,000 points)
and posted to `POST /runner/v1/runs/{id}/metrics` with the same retries as logs; everything
is sent before the run's `/exit`. docs/metrics.md is the user's side of this.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from gpulease.gpus.sampling import GpuReading, GpuSampler, real_uuids
from gpulease.runner import safefs
from gpulease.runner.connection import Connection, ServerGone, Unreachable
from gpulease.runner.logs import Outbox
from gpulease.runner.sandbox import METRICS_ROOT, SDK_ROOT, Sandbox
from gpulease.runner.tensorboard import EventDirectoryWatcher
from gpulease.schemas.metrics import METRIC_KEY, METRIC_KEY_PATTERN
from gpulease.schemas.runner import (
    RUNNER_API,
    RunnerGpuSample,
    RunnerGpuSamples,
    RunnerMetricPoint,
    RunnerMetrics,
)

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.5
FLUSH_POINTS = 1000
MAX_POINTS_PER_REQUEST = 5000
TENSORBOARD_POLL_S = 1.0
MAX_LINE_CHARS = 4096  # a longer stdout line is not a metrics line
MAX_SDK_LINE_BYTES = 1024 * 1024
MAX_READ_BYTES = 16 * 1024 * 1024  # of the SDK file per collect()
SDK_DIR = "sdk"  # under the runner's run_dir: gpulease/{__init__,track}.py
METRICS_DIR = "metrics"  # under run_dir: one directory per run, holding SDK_FILE
SDK_FILE = "sdk.jsonl"
TENSORBOARD_DIR = "runs"  # SummaryWriter's default log directory, in the workspace
STEP_KEYS = ("step", "epoch")
SOURCES = ("sdk", "stdout", "tensorboard")

_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
_INTEGER = re.compile(r"^\+?\d{1,18}$")
_TOKEN = re.compile(rf"^({METRIC_KEY})=(\S+)$")
_SEPARATORS = re.compile(r"[\s,]+")

# The package the runner puts on every run's PYTHONPATH. extend_path lets a gpulease that
# the venv has installed still provide its other modules (gpulease.client, ...).
_SDK_INIT = '''"""gpulease in an instance: `from gpulease import track` (written by the runner)."""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
'''


class StepCounter:
    """Steps for values that come without one: each key counts on from its last step."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def step(self, key: str, given: int | None) -> int:
        step = self._next.get(key, 0) if given is None else given
        self._next[key] = step + 1
        return step

    def point(
        self, key: str, given: int | None, value: float, when: float, source: str
    ) -> RunnerMetricPoint:
        """A point of key at the step given, else the key's next one."""
        return RunnerMetricPoint(
            key=key, step=self.step(key, given), value=value, time=when, source=source
        )


def valid_point(key: str, value: float) -> bool:
    return bool(METRIC_KEY_PATTERN.match(key)) and math.isfinite(value)


# -- stdout ------------------------------------------------------------------------------------


def parse_line(line: str) -> tuple[int | None, dict[str, float]] | None:
    """A stdout line as (step, values), or None when it is not a metrics line.

    A metrics line is made only of `key=value` tokens (separated by spaces, tabs or commas)
    with at least one numeric value. `step=N` (else `epoch=N`) gives the step and is not a
    value itself; a step that is not a non-negative integer makes the line not count.
    Non-numeric values (`device=cuda`) are allowed and ignored; non-finite ones too.
    """
    text = line.strip()
    if not text or len(text) > MAX_LINE_CHARS or "=" not in text:
        return None
    pairs: dict[str, str] = {}
    for token in _SEPARATORS.split(text):
        if not token:
            continue
        match = _TOKEN.match(token)
        if match is None:
            return None
        pairs[match.group(1)] = match.group(2)
    step: int | None = None
    for name in STEP_KEYS:
        if name in pairs:
            raw = pairs.pop(name)
            if not _INTEGER.match(raw):
                return None
            step = int(raw)
            break
    values = {
        key: float(raw)
        for key, raw in pairs.items()
        if _NUMBER.match(raw) and math.isfinite(float(raw))
    }
    if not values:
        return None
    return step, values


class StdoutParser:
    """Metric points from a stream of stdout text, as it is read: a line may arrive in
    several pieces; only complete lines (ended by \\n or \\r) count until finish()."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._partial = ""
        self._counter = StepCounter()

    def feed(self, text: str) -> list[RunnerMetricPoint]:
        data = self._partial + text
        lines = re.split(r"\r\n|\n|\r", data)
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE_CHARS:
            self._partial = " " * (MAX_LINE_CHARS + 1)  # keeps the line too long, cheaply
        return self._points(lines)

    def finish(self) -> list[RunnerMetricPoint]:
        """The last line, when the output did not end with a newline."""
        partial, self._partial = self._partial, ""
        return self._points([partial])

    def _points(self, lines: Sequence[str]) -> list[RunnerMetricPoint]:
        points: list[RunnerMetricPoint] = []
        now = self._clock()
        for line in lines:
            parsed = parse_line(line)
            if parsed is None:
                continue
            step, values = parsed
            points += [
                self._counter.point(key, step, value, now, "stdout")
                for key, value in values.items()
            ]
        return points


# -- SDK file ----------------------------------------------------------------------------------


class SdkFileReader:
    """The points in the JSON lines gpulease.track appended to path since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self._counter = StepCounter()
        self._bad_lines = 0

    def read_new(self) -> list[RunnerMetricPoint]:
        try:
            data = _read_regular(self.path, self._offset)
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.debug("metrics file %s cannot be read: %s", self.path, exc)
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_SDK_LINE_BYTES:
            self._partial = b""
            self._bad_line("a line longer than 1 MiB")
        points: list[RunnerMetricPoint] = []
        for line in lines:
            if line.strip():
                points += self._parse(line)
        return points

    def _parse(self, line: bytes) -> list[RunnerMetricPoint]:
        try:
            item = json.loads(line)
            values = item["values"]
            step = item.get("step")
            when = float(item.get("time") or time.time())
            if not isinstance(values, dict):
                raise TypeError("values is not an object")
            if step is not None and (
                isinstance(step, bool) or not isinstance(step, int) or step < 0
            ):
                raise TypeError("step is not a non-negative integer")
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self._bad_line(str(exc))
            return []
        points = []
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            number = float(value)
            if isinstance(key, str) and valid_point(key, number):
                points.append(self._counter.point(key, step, number, when, "sdk"))
        return points

    def _bad_line(self, why: str) -> None:
        self._bad_lines += 1
        if self._bad_lines == 1:
            log.warning("%s: a line that is not a metrics record is skipped (%s)", self.path, why)


def _read_regular(path: Path, offset: int) -> bytes:
    """At most MAX_READ_BYTES of a regular file from offset (the rest is read next time),
    never through a symlink, a FIFO or a second hard link (runner/safefs.py): the job can
    write the directory and could point a link at the runner's own files."""
    return safefs.read_bytes(
        path.parent, path.name, limit=MAX_READ_BYTES, offset=offset, single_link=True
    )


# -- one run -----------------------------------------------------------------------------------


class RunMetrics(Outbox):
    """The points of one run from its three sources, kept until the server has them.

    on_output() is called by the stdout reader thread; collect(), unsent() and ack() by
    the one thread that sends; close() once the run's output is complete. Thread-safe.
    """

    def __init__(
        self,
        *,
        sdk_file: Path | None = None,
        tensorboard_root: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self._pending: list[RunnerMetricPoint] = []
        self._stdout = StdoutParser(clock)
        self._sdk = None if sdk_file is None else SdkFileReader(sdk_file)
        self._tensorboard = (
            None if tensorboard_root is None else EventDirectoryWatcher(tensorboard_root)
        )
        self._tensorboard_polled = 0.0
        self.dropped = 0

    def on_output(self, stream: str, text: str) -> None:
        if stream == "stdout":
            self._add(self._stdout.feed(text))

    def close(self) -> None:
        """The run's output is complete: its last line counts; the sender sends what is left."""
        if self._closed:
            return
        self._add(self._stdout.finish())  # the reader thread is done with the parser
        super().close()

    def collect(self, *, force: bool = False) -> None:
        """Read what the SDK file and the TensorBoard files gained (those every second)."""
        if self._sdk is not None:
            self._add(self._sdk.read_new())
        if self._tensorboard is not None:
            now = time.monotonic()
            if force or now - self._tensorboard_polled >= TENSORBOARD_POLL_S:
                self._tensorboard_polled = now
                self._add(
                    [
                        RunnerMetricPoint(
                            key=key,
                            step=s.step,
                            value=s.value,
                            time=s.wall_time,
                            source="tensorboard",
                        )
                        for key, s in self._tensorboard.poll()
                        if s.step >= 0
                    ]
                )

    def _add(self, points: Sequence[RunnerMetricPoint]) -> None:
        good = [p for p in points if valid_point(p.key, p.value)]
        with self._cond:
            self.dropped += len(points) - len(good)
            self._pending += good
            if len(self._pending) >= FLUSH_POINTS:
                self._cond.notify_all()

    def _full(self) -> bool:
        return len(self._pending) >= FLUSH_POINTS

    def unsent(self, limit: int = MAX_POINTS_PER_REQUEST) -> list[RunnerMetricPoint]:
        with self._cond:
            return self._pending[:limit]

    def ack(self, points: Sequence[RunnerMetricPoint]) -> None:
        """Forget the oldest len(points) points (the ones unsent() returned)."""
        with self._cond:
            del self._pending[: len(points)]


def batch_body(points: Sequence[RunnerMetricPoint]) -> bytes:
    """A batch as the JSON body of POST /runs/{id}/metrics, written by pydantic in one call
    (a model_dump and json.dumps of 1,000 points took the runner 2.5 ms, this 0.4 ms)."""
    return RunnerMetrics(points=list(points)).model_dump_json().encode()


def send_metrics(
    connection: Connection,
    run_id: int,
    metrics: RunMetrics,
    interval_s: float = FLUSH_INTERVAL_S,
) -> None:
    """Until metrics is closed and everything is sent: collect, post, wait. Retries like
    the logs (the server being away loses nothing); a 4xx answer drops that batch (it was
    logged), and a 404 ends sending for the run (the server does not take its metrics)."""
    path = f"{RUNNER_API}/runs/{run_id}/metrics"
    while True:
        done = metrics.closed
        metrics.collect(force=done)
        while batch := metrics.unsent():
            try:
                response = connection.call("POST", path, content=batch_body(batch))
            except ServerGone:
                return
            if response.status_code == 404:
                log.warning("run %d: the server takes no metrics for it (404)", run_id)
                return
            metrics.ack(batch)
        if done:
            return
        metrics.wait(interval_s)


# -- the SDK inside instances ------------------------------------------------------------------


def install_sdk(run_dir: Path) -> Path:
    """Write run_dir/sdk/gpulease/{__init__,track}.py (the directory every run gets on its
    PYTHONPATH) and return run_dir/sdk."""
    from gpulease import track

    root = run_dir / SDK_DIR
    package = root / "gpulease"
    package.mkdir(parents=True, exist_ok=True)
    source = Path(track.__file__).read_text(encoding="utf-8")
    for name, text in (("__init__.py", _SDK_INIT), ("track.py", source)):
        target = package / name
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            temporary = target.with_suffix(".tmp")
            temporary.write_text(text, encoding="utf-8")
            temporary.chmod(0o644)
            temporary.replace(target)
    return root


def run_metrics_dir(run_dir: Path, run_id: int) -> Path:
    """The directory of a run's SDK file (the only runner directory a job may write)."""
    directory = run_dir / METRICS_DIR / str(run_id)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def sdk_environment(env: dict[str, str], *, sdk_dir: str, metrics_dir: str) -> dict[str, str]:
    """env plus what the SDK needs: the SDK directory on PYTHONPATH (after the user's own
    entries) and GPULEASE_METRICS_FILE. The paths are as the job sees them."""
    result = dict(env)
    entries = [entry for entry in result.get("PYTHONPATH", "").split(os.pathsep) if entry]
    result["PYTHONPATH"] = os.pathsep.join([*entries, sdk_dir])
    result["GPULEASE_METRICS_FILE"] = f"{metrics_dir}/{SDK_FILE}"
    return result


# -- GPU samples -------------------------------------------------------------------------------


def prepare_run(
    run_dir: Path,
    workspace: Path,
    run_id: int,
    env: dict[str, str],
    sandbox: Sandbox | None,
) -> tuple[dict[str, str], Sandbox | None, RunMetrics]:
    """What a run needs for its metrics: its environment with the SDK (PYTHONPATH,
    GPULEASE_METRICS_FILE), its sandbox with the SDK (read-only) and its metrics directory
    (writable) bound in, and the RunMetrics that collects its points."""
    sdk = install_sdk(run_dir)
    directory = run_metrics_dir(run_dir, run_id)
    sdk_file = directory / SDK_FILE
    sdk_file.unlink(missing_ok=True)
    if sandbox is not None:
        sandbox = replace(sandbox, sdk=sdk, metrics=directory)
        env = sdk_environment(env, sdk_dir=SDK_ROOT, metrics_dir=METRICS_ROOT)
    else:
        env = sdk_environment(env, sdk_dir=str(sdk), metrics_dir=str(directory))
    metrics = RunMetrics(sdk_file=sdk_file, tensorboard_root=workspace / TENSORBOARD_DIR)
    return env, sandbox, metrics


def sample_gpus(
    connection: Connection, uuids: Sequence[str], interval_s: float, finished: threading.Event
) -> None:
    """The runner's GPU sampling loop: its own real GPUs, every interval_s, until finished.
    Returns at once when there is nothing to sample (simulated GPUs, no NVML)."""
    if interval_s <= 0 or not real_uuids(uuids):
        return
    sampler = GpuSampler(uuids)
    try:
        if sampler.active:
            send_gpu_samples(connection, sampler.read, interval_s, finished)
    finally:
        sampler.close()


def send_gpu_samples(
    connection: Connection,
    sample: Callable[[], Sequence[GpuReading]],
    interval_s: float,
    finished: threading.Event,
    max_kept: int = 120,
) -> None:
    """Every interval_s until finished: take readings (GpuReading) and post them. Samples
    are best effort: one try each time; unsent ones are kept (the newest max_kept) and go
    with the next post."""
    unsent: list[RunnerGpuSample] = []
    warned = False
    while not finished.is_set():
        started = time.monotonic()
        try:
            unsent += [RunnerGpuSample.model_validate(r.to_json()) for r in sample()]
        except Exception:
            log.exception("reading the GPUs failed")
        unsent = unsent[-max_kept:]
        if unsent:
            try:
                response = connection.call(
                    "POST",
                    f"{RUNNER_API}/gpu-samples",
                    json=RunnerGpuSamples(samples=unsent).model_dump(mode="json"),
                    retry=False,
                    timeout=10,
                )
            except ServerGone:
                return
            except Unreachable as exc:
                if not warned:
                    log.warning("GPU samples not delivered: %s", exc)
                warned = True
            else:
                warned = False
                unsent = []  # delivered, or refused (4xx, logged): either way not again
                if response.status_code == 404:
                    log.warning("the server takes no GPU samples (404); sampling stops")
                    return
        finished.wait(max(0.0, interval_s - (time.monotonic() - started)))
