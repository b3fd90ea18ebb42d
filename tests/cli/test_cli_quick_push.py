"""`gpulease dataset push`'s quick path for an unchanged tree (cli/entry.py): the in-process
server app served on a loopback port (over_tcp), since the quick path speaks HTTP itself;
the Typer command pushes over real HTTP too, so that both keep the push index of that URL."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from inprocess import InProcessServer
from typer.testing import CliRunner

from datasets_support import random_tree
from gpulease.cli import entry
from gpulease.cli.main import app
from gpulease.client.push_index import index_path
from gpulease.client.scan import taken_over


@pytest.fixture
def tree(
    server: InProcessServer, over_tcp: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """ann's logged-in CLI and a tree of hers, pushed once as 'imgs' by the Typer command."""
    token = server.user("ann").token
    assert token is not None
    monkeypatch.setenv("GPULEASE_TOKEN", token)
    root = tmp_path / "imgs"
    random_tree(root, 40, 500)
    assert _typer_push(root)["unchanged"] is False
    # The index trusts no tree changed within two seconds of its push (racily clean, as
    # git's index): this one was pushed a minute after it was written.
    with sqlite3.connect(index_path(over_tcp, "imgs")) as index:
        assert index.execute("UPDATE tree SET hashed_ns = hashed_ns + 60000000000").rowcount == 1
    return root


def _typer_push(root: Path, *options: str) -> dict[str, object]:
    result = CliRunner().invoke(app, ["dataset", "push", str(root), "-o", "json", *options])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert isinstance(found, dict)
    return found


def _quick(argv: list[str]) -> int | None:
    request = entry.push_request(argv)
    assert request is not None
    return entry.quick_push(request)


def test_an_unchanged_push_ends_on_the_quick_path_as_the_typer_command_would(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert _quick(["dataset", "push", str(tree), "-o", "json"]) == 0
    quick = json.loads(capsys.readouterr().out)
    typer = _typer_push(tree)
    assert quick["unchanged"] is True and quick["files"] == 40 and quick["index_hits"] == 40
    quick.pop("seconds"), typer.pop("seconds")
    assert quick == typer

    assert _quick(["dataset", "push", str(tree), "--name=imgs"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("imgs v1 already holds these 40 files (") and "nothing to push" in said
    assert taken_over(tree) is None  # settled there: its scan is kept for no push


def test_anything_but_an_unchanged_tree_is_left_to_the_typer_command(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changed tree, another dataset name (no index), a name the server has no version
    of, a refused path, a wrong token: the quick path prints nothing and hands over."""
    capsys.readouterr()
    other = tmp_path / "other"
    random_tree(other, 3, 100, seed=1)
    (tree / "class_0" / "new.bin").write_bytes(b"new")
    assert _quick(["dataset", "push", str(tree)]) is None  # changed
    assert _quick(["dataset", "push", str(other), "-n", "imgs"]) is None  # another tree
    assert _quick(["dataset", "push", str(other)]) is None  # no index for 'other'
    (tree / "class_0" / "new.bin").unlink()
    assert _quick(["dataset", "push", str(tree), "-n", "Not A Name"]) is None
    (tree / "bad\x01name").write_bytes(b"x")
    assert _quick(["dataset", "push", str(tree)]) is None  # refused: the Typer app says why
    (tree / "bad\x01name").unlink()
    monkeypatch.setenv("GPULEASE_TOKEN", "not-a-token")
    assert _quick(["dataset", "push", str(tree)]) is None
    assert capsys.readouterr().out == ""


def test_a_changed_tree_is_pushed_by_the_typer_command_on_the_quick_paths_scan(
    tree: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quick path hands its scan over; the push that follows in the same command takes
    it instead of scanning the tree again, and pushes what changed."""
    from gpulease.client import datasets

    (tree / "class_0" / "new.bin").write_bytes(b"a new file")
    capsys.readouterr()
    assert _quick(["dataset", "push", str(tree)]) is None
    assert capsys.readouterr().out == ""

    def no_second_scan(root: Path) -> None:
        raise AssertionError(f"{root} scanned again")

    monkeypatch.setattr(datasets, "scan_tree", no_second_scan)
    pushed = _typer_push(tree)
    assert pushed["files"] == 41 and pushed["sent_chunks"] == 1  # the new file alone
    assert pushed["dataset"]["current_version"] == 2  # type: ignore[index]
    assert taken_over(tree) is None  # taken once, by that push


def test_only_the_plain_push_form_takes_the_quick_path() -> None:
    push = entry.push_request
    assert push(["dataset", "push", "d"]) == entry.PushRequest("d", None, False)
    assert push(["dataset", "push", "-n", "x", "d", "--output", "json"]) == entry.PushRequest(
        "d", "x", True
    )
    assert push(["dataset", "push", "d", "--name=x", "-o", "table"]) == entry.PushRequest(
        "d", "x", False
    )
    for argv in (
        ["dataset", "push"],
        ["dataset", "push", "--help"],
        ["dataset", "push", "d", "e"],
        ["dataset", "push", "d", "-n"],
        ["dataset", "push", "d", "-n", "x", "-n", "y"],
        ["dataset", "push", "d", "-n=x"],
        ["dataset", "push", "d", "-o", "csv"],
        ["dataset", "push", "d", "--", "e"],
        ["dataset", "push", "-d"],
        ["dataset", "ls"],
    ):
        assert push(argv) is None, argv
