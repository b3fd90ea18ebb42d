"""`gpulease ticket open/list/show/reply/close` against the real server app in process."""

from __future__ import annotations

import json

from wired_cli import Cli

from gpulease.schemas.instances import InstanceCreate


def test_ticket_round_trip_with_an_attached_log(cli: Cli) -> None:
    ann = cli.login_as("ann")
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    cli.server.cluster.job = lambda run: ([("stdout", "epoch 1\n"), ("stderr", "CUDA oops\n")], 1)
    cli.server.cluster.start()
    assert cli("exec", "box", "--", "python train.py").exit_code == 1
    (run,) = ann.runs.list()

    opened = cli(
        "ticket",
        "open",
        "-s",
        "crash",
        "-m",
        "it dies",
        "--run",
        str(run.id),
        "--attach-log",
        "-o",
        "json",
    )
    assert opened.exit_code == 0, opened.output
    ticket = json.loads(opened.stdout)
    assert ticket["instance"] == "box" and ticket["messages"][0]["log_excerpt"] == (
        "epoch 1\nCUDA oops"
    )
    listed = cli("ticket", "list")
    assert "crash" in listed.stdout and "open" in listed.stdout

    cli.login_as_admin()
    assert "crash" in cli("ticket", "list").stdout  # admins see every ticket
    answered = cli("ticket", "reply", str(ticket["id"]), input="update the driver\n")
    assert answered.exit_code == 0 and "answered" in answered.stderr

    shown = ann.support.get(ticket["id"])
    assert [m.body for m in shown.messages] == ["it dies", "update the driver"]
    assert any(n.kind == "ticket_reply" for n in ann.notifications.list())
    text = cli("ticket", "show", str(ticket["id"])).stdout
    assert "update the driver" in text and "admin (support)" in text and "CUDA oops" in text
    closed = cli("ticket", "close", str(ticket["id"]))
    assert closed.exit_code == 0 and "closed" in closed.stderr


def test_ticket_refusals(cli: Cli) -> None:
    cli.login_as("ann")
    empty = cli("ticket", "open", "-s", "x", "-m", "  ")
    assert empty.exit_code == 1 and "the message is empty" in empty.stderr
    unknown = cli("ticket", "open", "-s", "x", "-m", "y", "--run", "4242")
    assert unknown.exit_code == 1 and "you have no run 4242" in unknown.stderr
    missing = cli("ticket", "show", "999")
    assert missing.exit_code == 1 and "you have no support ticket 999" in missing.stderr
