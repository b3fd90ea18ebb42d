"""`gpulease exec`'s and `gpulease run`'s quick path (cli/entry.py, client/quickexec.py): the
in-process server app served on a loopback port, since the quick path speaks HTTP itself."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from inprocess import InProcessServer

from gpulease.cli import entry
from gpulease.schemas.instances import InstanceCreate


def login(server: InProcessServer, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    token = server.user(name).token
    assert token is not None
    monkeypatch.setenv("GPULEASE_TOKEN", token)


def test_quick_exec_streams_the_output_and_exits_with_the_code(
    server: InProcessServer,
    over_tcp: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    login(server, "ann", monkeypatch)
    server.user("ann").instances.create(InstanceCreate(gpu="T4:1", name="box"))
    server.cluster.job = lambda run: ([("stdout", "out 1\n"), ("stderr", "err 1\n")], 3)
    server.cluster.start()
    server.cluster.wait_for(lambda: server.user("ann").instances.get("box").status == "running")
    request = entry.exec_request(["exec", "box", "-e", "LR=0.1", "--", "python", "t.py", "a b"])
    assert request is not None
    assert entry.quick_exec(request) == 3
    out = capsys.readouterr()
    assert out.out == "out 1\n"
    assert "err 1\n" in out.err and "on instance box" in out.err
    (run,) = server.cluster.runs
    assert run["command"] == "python t.py 'a b'" and run["env"] == {"LR": "0.1"}


def test_quick_exec_on_a_queued_instance_hands_over_and_says_what_it_waits_for(
    server: InProcessServer,
    over_tcp: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    login(server, "ann", monkeypatch)
    ann = server.user("ann")
    ann.instances.create(InstanceCreate(gpu="T4:1", name="first"))
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))  # queued behind it
    server.cluster.start()
    threading.Timer(0.5, lambda: ann.instances.release("first")).start()
    request = entry.exec_request(["exec", "box", "--", "echo hi"])
    assert request is not None
    assert entry.quick_exec(request) == 0
    out = capsys.readouterr()
    assert out.out == "running: echo hi\n"
    assert "queued" in out.err
    assert len(server.cluster.runs) == 1  # the hand-over follows the run, never posts again


def test_quick_exec_refusals_say_what_was_wrong(
    server: InProcessServer,
    over_tcp: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server.user("bob").instances.create(InstanceCreate(gpu="T4:1", name="box"))
    login(server, "ann", monkeypatch)
    request = entry.exec_request(["exec", "box", "--", "cat secret"])
    assert request is not None
    assert entry.quick_exec(request) == 1
    assert "error: you have no instance 'box'" in capsys.readouterr().err
    monkeypatch.setenv("GPULEASE_SERVER", "http://127.0.0.1:9")  # nothing listens there
    assert entry.quick_exec(request) == 1
    assert "error: cannot reach the gpulease server at http://127.0.0.1:9" in (
        capsys.readouterr().err
    )
    monkeypatch.setenv("https_proxy", "http://proxy.invalid:3128")
    assert entry.quick_exec(request) is None  # the SDK's to send, through the proxy
    assert server.cluster.runs == []


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["exec", "box", "--", "echo", "hi"], ("box", ["echo", "hi"], {})),
        (
            ["exec", "box", "--env", "A=1", "-e", "B=x=y", "--", "true"],
            ("box", ["true"], {"A": "1", "B": "x=y"}),
        ),
        (["exec", "box", "--env=A=", "--", "true"], ("box", ["true"], {"A": ""})),
        (["exec", "box", "--", "--help"], ("box", ["--help"], {})),
    ],
)
def test_the_quick_path_takes_exec_in_its_one_form(
    argv: list[str], wanted: tuple[str, list[str], dict[str, str]]
) -> None:
    request = entry.exec_request(argv)
    assert request is not None
    assert (request.ref, request.command, request.env) == wanted


@pytest.mark.parametrize(
    "argv",
    [
        ["exec", "--help"],
        ["exec", "box", "echo", "hi"],  # no --
        ["exec", "box", "--"],  # no command
        ["exec", "box", "--env", "NOEQUALS", "--", "true"],  # Typer says what is wrong
        ["exec", "box", "--env", "1A=2", "--", "true"],
        ["exec", "box", "--verbose", "--", "true"],
        ["exec", "-e", "A=1", "box", "--", "true"],
        ["run", "box", "--", "true"],
        [],
    ],
)
def test_anything_else_goes_to_the_typer_app(argv: list[str]) -> None:
    assert entry.exec_request(argv) is None


def test_quick_run_makes_the_instance_and_run_then_follows_them_to_the_release(
    server: InProcessServer,
    over_tcp: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gpulease.client import quickexec

    login(server, "ann", monkeypatch)
    # The job writes once the quick path follows its run, as a job that runs for a while
    # would: a job that had already ended when the CLI first looked is `run`'s to report.
    following = threading.Event()
    real_open_stream = quickexec.open_stream

    def open_stream(*args: Any, **kwargs: Any) -> Any:
        stream = real_open_stream(*args, **kwargs)
        following.set()
        return stream

    def job(run: dict[str, Any]) -> tuple[list[tuple[str, str]], int]:
        following.wait(timeout=30)
        return [("stdout", "out 1\n"), ("stderr", "boom\n")], 7

    monkeypatch.setattr(quickexec, "open_stream", open_stream)
    server.cluster.job = job
    server.cluster.start()
    request = entry.run_request(["run", "--gpu", "A100-80GB:1", "-e", "K=V", "--", "x", "a b"])
    assert request is not None
    assert entry.quick_run(request) == 7
    out = capsys.readouterr()
    assert out.out == "out 1\n"
    assert "boom\n" in out.err and "failed with exit code 7" in out.err
    assert "run 1: x 'a b'\n" in out.err  # the quick path streamed it
    (run,) = server.cluster.runs  # the hand-over follows the run, never posts again
    assert (run["command"], run["env"]) == ("x 'a b'", {"K": "V"})
    (instance,) = server.user("ann").instances.list(include_released=True)
    assert (instance.gpu_model, instance.template) == ("A100-80GB", "pytorch")
    assert instance.status == "released"


def test_quick_run_refusals_say_what_was_wrong(
    server: InProcessServer,
    over_tcp: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    login(server, "ann", monkeypatch)
    request = entry.run_request(["run", "--gpu", "Z9:1", "--", "true"])
    assert request is not None
    assert entry.quick_run(request) == 1
    assert "error: " in (err := capsys.readouterr().err) and "Z9" in err
    assert server.user("ann").instances.list(include_released=True) == []
    monkeypatch.setenv("https_proxy", "http://proxy.invalid:3128")
    assert entry.quick_run(request) is None  # the SDK's to send, through the proxy


def test_the_quick_requests_reach_only_the_callers_instances(
    server: InProcessServer, over_tcp: str
) -> None:
    from gpulease.client import quickexec
    from gpulease.client.errors import ApiError

    box = server.user("bob").instances.create(InstanceCreate(gpu="T4:1", name="box"))
    token = server.user("ann").token
    assert token is not None
    with pytest.raises(ApiError) as refused:
        quickexec.call_json(over_tcp, token, None, "POST", f"/instances/{box.id}/runs", {
            "command": "cat secret"
        })  # fmt: skip
    assert refused.value.status == 404
    assert server.cluster.runs == []


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["run", "--", "echo", "hi"], (["echo", "hi"], {}, None, None)),
        (
            ["run", "--gpu=T4:1", "--template", "python", "--env", "A=1", "--", "true"],
            (["true"], {"A": "1"}, "T4:1", "python"),
        ),
        (["run", "-e", "B=x=y", "--gpu", "T4:1", "--", "t.yaml", "x"],
         (["t.yaml", "x"], {"B": "x=y"}, "T4:1", None)),
    ],
)  # fmt: skip
def test_the_quick_path_takes_run_with_a_command(
    argv: list[str], wanted: tuple[list[str], dict[str, str], str | None, str | None]
) -> None:
    request = entry.run_request(argv)
    assert request is not None
    assert (request.command, request.env, request.gpu, request.template) == wanted


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "task.yaml"],
        ["run", "--", "task.yaml"],  # the task file's
        ["run", "--gpu", "T4:1"],  # no command
        ["run", "--gpu", "T4:1", "--gpu", "A100-80GB:1", "--", "true"],
        ["run", "--gpu", "--", "true"],
        ["run", "--retry", "1", "--", "true"],
        ["run", "--workdir", ".", "--", "true"],
        ["run", "--spot", "--", "true"],
        ["run", "-e", "1A=2", "--", "true"],
        ["run", "--help"],
    ],
)
def test_a_run_with_anything_else_goes_to_the_typer_app(argv: list[str]) -> None:
    assert entry.run_request(argv) is None
