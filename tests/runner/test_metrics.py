"""Metric points in the runner: the SDK, the stdout grammar, collecting and batching."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulease.runner.connection import Connection
from gpulease.runner.metrics import (
    FLUSH_POINTS,
    MAX_POINTS_PER_REQUEST,
    SDK_FILE,
    RunMetrics,
    StdoutParser,
    install_sdk,
    parse_line,
    prepare_run,
    send_metrics,
)
from gpulease.runner.sandbox import METRICS_ROOT, SDK_ROOT, Sandbox
from gpulease.schemas.runner import RunnerMetricPoint

SRC = Path(__file__).resolve().parents[2] / "src"


# -- the SDK -------------------------------------------------------------------------------------


def point(key: str, step: int, value: float, time: float, source: str) -> RunnerMetricPoint:
    return RunnerMetricPoint(key=key, step=step, value=value, time=time, source=source)


def _python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPULEASE_")}
    clean.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], env=clean, cwd=cwd, capture_output=True, text=True
    )


SDK_CALLS = """
import math
from gpulease import track
track.log(step=10, loss=0.5, acc=0.9)
track.log(11, loss=0.25)
track.log(loss=0.125)
track.log(step=12, loss=float("nan"), acc="high", ok=1)
track.log(step=13, loss=math.inf)
track.log(step=14, **{"bad key": 1.0, "fine": 2})
track.log(step=-1, neg=3.0)
print("done")
"""


def test_track_outside_the_platform_does_nothing_and_never_raises(tmp_path: Path) -> None:
    result = _python(SDK_CALLS, {"PYTHONPATH": str(SRC)}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert list(tmp_path.iterdir()) == []  # no file written anywhere here


def test_track_inside_the_platform_appends_json_lines(tmp_path: Path) -> None:
    target = tmp_path / "m" / SDK_FILE
    target.parent.mkdir()
    result = _python(
        SDK_CALLS, {"PYTHONPATH": str(SRC), "GPULEASE_METRICS_FILE": str(target)}, tmp_path
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert [(line["step"], line["values"]) for line in lines] == [
        (10, {"loss": 0.5, "acc": 0.9}),
        (11, {"loss": 0.25}),
        (None, {"loss": 0.125}),
        (12, {"ok": 1.0}),
        (14, {"fine": 2.0}),
        (None, {"neg": 3.0}),
    ]
    assert all(isinstance(line["time"], float) for line in lines)
    # each problem is told once on stderr, never raised
    warnings = result.stderr.splitlines()
    assert len(warnings) == 4, result.stderr  # loss=inf: the same problem as nan
    assert any("loss=nan is not finite" in w for w in warnings)
    assert any("acc='high' is not a number" in w for w in warnings)
    assert any("'bad key' is not valid" in w for w in warnings)
    assert any("step=-1" in w for w in warnings)


def test_track_writes_a_local_file_when_asked(tmp_path: Path) -> None:
    target = tmp_path / "local.jsonl"
    code = "from gpulease import track; track.log(1, loss=2.0)"
    result = _python(code, {"PYTHONPATH": str(SRC), "GPULEASE_TRACK_FILE": str(target)}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(target.read_text())["values"] == {"loss": 2.0}


def test_track_survives_an_unwritable_file(tmp_path: Path) -> None:
    code = "from gpulease import track; track.log(1, loss=2.0); track.log(2, loss=1.0); print('ok')"
    env = {"PYTHONPATH": str(SRC), "GPULEASE_METRICS_FILE": str(tmp_path / "no" / "dir" / "f")}
    result = _python(code, env, tmp_path)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    assert result.stderr.count("cannot be written") == 1


def test_the_copied_sdk_imports_without_gpulease_installed(tmp_path: Path) -> None:
    sdk = install_sdk(tmp_path / "run")
    target = tmp_path / "points.jsonl"
    code = "import gpulease\nfrom gpulease import track\ntrack.log(3, x=1)\n"
    code += "print(gpulease.__file__)"
    # -I: no site-packages, no user PYTHONPATH: only the copied package can be found
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(sdk)!r}); {code}"],
        env={"GPULEASE_METRICS_FILE": str(target), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(sdk / "gpulease" / "__init__.py")
    assert json.loads(target.read_text())["values"] == {"x": 1.0}
    assert install_sdk(tmp_path / "run") == sdk  # again: unchanged, no error


def test_the_copied_sdk_leaves_an_installed_gpulease_usable(tmp_path: Path) -> None:
    sdk = install_sdk(tmp_path / "run")
    code = "import gpulease.client.api, gpulease.track as t; print(t.__file__)"
    result = _python(code, {"PYTHONPATH": os.pathsep.join([str(sdk), str(SRC)])}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(sdk / "gpulease" / "track.py")


# -- stdout ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("epoch=1 loss=0.5 acc=0.9", (1, {"loss": 0.5, "acc": 0.9})),
        ("step=20, loss=1e-3, lr=2.5E+2", (20, {"loss": 0.001, "lr": 250.0})),
        ("step=3 epoch=1 loss=.5", (3, {"epoch": 1.0, "loss": 0.5})),
        ("  loss=-2\t train/acc=7  ", (None, {"loss": -2.0, "train/acc": 7.0})),
        ("device=cuda loss=0.1 name='x'", (None, {"loss": 0.1})),
        ("loss=nan acc=0.5", (None, {"acc": 0.5})),
    ],
)
def test_metrics_lines(line: str, expected: tuple[int | None, dict[str, float]]) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "",
        "epoch 1 loss=0.5",  # a token that is not key=value
        "device=cuda name=cpu",  # no numeric value
        "step=1.5 loss=0.5",  # a step that is not an integer
        "step=-1 loss=0.5",
        "loss=nan",
        "loss=inf",
        "1loss=0.5",  # not a key
        "loss=0x10",
        "loss=1_000",
        "saved=model.pt",
        "x=1 " * 2000,  # too long
        "Traceback (most recent call last):",
    ],
)
def test_lines_that_are_not_metrics(line: str) -> None:
    assert parse_line(line) is None


def test_stdout_parser_joins_lines_split_across_reads() -> None:
    parser = StdoutParser(clock=lambda: 5.0)
    assert parser.feed("epoch=1 lo") == []
    assert parser.feed("ss=0.5\nprogress 10%\rstep=") == [point("loss", 1, 0.5, 5.0, "stdout")]
    assert parser.feed("2 loss=0.25\r\nloss=") == [point("loss", 2, 0.25, 5.0, "stdout")]
    # without a step each key counts on from its last step; the unended last line counts
    assert parser.feed("0.1 acc=1\n") == [
        point("loss", 3, 0.1, 5.0, "stdout"),
        point("acc", 0, 1.0, 5.0, "stdout"),
    ]
    assert parser.feed("loss=0.05") == []
    assert parser.finish() == [point("loss", 4, 0.05, 5.0, "stdout")]


def test_a_runaway_line_is_not_kept_in_memory() -> None:
    parser = StdoutParser(clock=lambda: 2.0)
    for _ in range(100):
        assert parser.feed("x=1 " * 1000) == []
    assert len(parser._partial) <= 5000
    assert parser.feed("\nloss=1\n") == [point("loss", 0, 1.0, 2.0, "stdout")]


# -- collecting and sending --------------------------------------------------------------------


def _sdk_line(step: int | None, **values: Any) -> str:
    return json.dumps({"step": step, "time": 7.0, "values": values}) + "\n"


def test_run_metrics_reads_the_sdk_file_as_it_grows(tmp_path: Path) -> None:
    sdk = tmp_path / SDK_FILE
    metrics = RunMetrics(sdk_file=sdk)
    metrics.collect()
    assert metrics.unsent() == []  # no file yet
    with sdk.open("a") as out:
        out.write(_sdk_line(None, loss=1.0) + _sdk_line(None, loss=0.5, acc=0.1))
        out.write('{"step": 5, "time": 7.0, "val')  # half a line: later
    metrics.collect()
    assert [(p.key, p.step, p.value) for p in metrics.unsent()] == [
        ("loss", 0, 1.0),
        ("loss", 1, 0.5),
        ("acc", 0, 0.1),
    ]
    metrics.ack(metrics.unsent())
    with sdk.open("a") as out:
        out.write('ues": {"loss": 0.25, "bad key": 1, "s": "x", "b": true}}\nnot json\n')
        out.write(_sdk_line(None, loss=0.2))
    metrics.collect()
    assert [(p.key, p.step, p.value, p.source) for p in metrics.unsent()] == [
        ("loss", 5, 0.25, "sdk"),
        ("loss", 6, 0.2, "sdk"),
    ]


def test_run_metrics_does_not_follow_a_symlink(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(_sdk_line(1, token=123.0))
    (tmp_path / SDK_FILE).symlink_to(secret)
    metrics = RunMetrics(sdk_file=tmp_path / SDK_FILE)
    metrics.collect()
    assert metrics.unsent() == []


class Recorder:
    """The server's side of POST /metrics: answers from a script, records what it got."""

    def __init__(self, answers: list[int] | None = None) -> None:
        self.answers = list(answers or [])
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        code = self.answers.pop(0) if self.answers else 204
        if code == 204:
            self.bodies.append(json.loads(request.content))
        return httpx.Response(code)

    def points(self) -> list[dict[str, Any]]:
        return [p for body in self.bodies for p in body["points"]]


def _connection(recorder: Recorder) -> Connection:
    return Connection(
        "http://server",
        "t",
        on_stop=lambda reason: None,
        transport=httpx.MockTransport(recorder),
        backoff_start_s=0.01,
        backoff_max_s=0.01,
    )


def test_everything_is_sent_when_the_run_ends_despite_server_errors(tmp_path: Path) -> None:
    recorder = Recorder(answers=[503, 502])
    metrics = RunMetrics(sdk_file=tmp_path / SDK_FILE, clock=lambda: 1.0)
    total = MAX_POINTS_PER_REQUEST + FLUSH_POINTS
    metrics.on_output("stdout", "".join(f"step={i} loss={i / 10}\n" for i in range(total)))
    metrics.on_output("stderr", "step=1 ignored=1\n")
    metrics.on_output("stdout", "step=99999 last=1")  # no newline: counts at close
    (tmp_path / SDK_FILE).write_text(_sdk_line(3, acc=0.5) + _sdk_line(4, acc=float("nan")))
    metrics.close()
    send_metrics(_connection(recorder), 4, metrics, interval_s=60)  # returns: all sent

    assert set(recorder.paths) == {"/runner/v1/runs/4/metrics"}
    assert all(len(body["points"]) <= MAX_POINTS_PER_REQUEST for body in recorder.bodies)
    points = recorder.points()
    stdout = [p for p in points if p["source"] == "stdout"]
    assert [(p["key"], p["step"]) for p in stdout] == [("loss", i) for i in range(total)] + [
        ("last", 99999)
    ]
    assert stdout[7] == {"key": "loss", "step": 7, "value": 0.7, "time": 1.0, "source": "stdout"}
    assert [(p["key"], p["step"], p["value"]) for p in points if p["source"] == "sdk"] == [
        ("acc", 3, 0.5)
    ]
    assert metrics.unsent() == []


def test_a_refused_batch_is_dropped_and_404_ends_sending(tmp_path: Path) -> None:
    recorder = Recorder(answers=[422])
    metrics = RunMetrics()
    metrics.on_output("stdout", "loss=1\n")
    metrics.close()
    send_metrics(_connection(recorder), 4, metrics, interval_s=60)
    assert recorder.points() == [] and metrics.unsent() == []

    recorder = Recorder(answers=[404])
    metrics = RunMetrics()
    metrics.on_output("stdout", "loss=1\n")
    send_metrics(_connection(recorder), 4, metrics, interval_s=60)  # returns, not closed
    assert len(recorder.paths) == 1


def test_points_are_sent_while_the_run_goes_on(tmp_path: Path) -> None:
    posted = threading.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        posted.set()
        return httpx.Response(204)

    connection = Connection(
        "http://server", "t", on_stop=lambda r: None, transport=httpx.MockTransport(handler)
    )
    metrics = RunMetrics()
    sender = threading.Thread(target=send_metrics, args=(connection, 1, metrics, 0.05))
    sender.start()
    metrics.on_output("stdout", "loss=1\n")
    assert posted.wait(10)  # before the run ends
    metrics.close()
    sender.join(10)
    assert not sender.is_alive()


def test_prepare_run_without_and_with_the_sandbox(tmp_path: Path) -> None:
    run_dir, workspace = tmp_path / "run", tmp_path / "ws"
    env, jail, metrics = prepare_run(run_dir, workspace, 7, {"PYTHONPATH": "/mine"}, None)
    assert jail is None
    assert env["PYTHONPATH"] == f"/mine{os.pathsep}{run_dir / 'sdk'}"
    assert env["GPULEASE_METRICS_FILE"] == str(run_dir / "metrics" / "7" / SDK_FILE)
    assert (run_dir / "sdk" / "gpulease" / "track.py").is_file()

    sandbox = Sandbox(workspace=workspace, env_dir=tmp_path / "venv", hostname="h")
    env, jail, _ = prepare_run(run_dir, workspace, 8, {}, sandbox)
    assert jail is not None and jail.sdk == run_dir / "sdk"
    assert jail.metrics == run_dir / "metrics" / "8"
    assert env == {"PYTHONPATH": SDK_ROOT, "GPULEASE_METRICS_FILE": f"{METRICS_ROOT}/{SDK_FILE}"}
    argv = jail.command(["true"])
    assert argv[argv.index(str(run_dir / "sdk")) - 1 : argv.index(str(run_dir / "sdk")) + 2] == [
        "--ro-bind",
        str(run_dir / "sdk"),
        SDK_ROOT,
    ]
    metrics_dir = str(run_dir / "metrics" / "8")
    assert argv[argv.index(metrics_dir) - 1 : argv.index(metrics_dir) + 2] == [
        "--bind",
        metrics_dir,
        METRICS_ROOT,
    ]
    assert str(run_dir) not in argv  # the runner's own directory stays out of sight
    del metrics


def test_the_sdk_checks_keys_with_the_protocols_pattern() -> None:
    """gpulease.track stays standard-library only inside instances, so it carries its own copy
    of the metric-key pattern; it must be the one the runner and the server use."""
    from gpulease import track
    from gpulease.schemas.metrics import METRIC_KEY_PATTERN

    assert track.KEY_PATTERN.pattern == METRIC_KEY_PATTERN.pattern
