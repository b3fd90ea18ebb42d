"""CLI dataset commands: push with progress, ls, show, rm, mounting, refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

from wired_cli import Cli

from datasets_support import random_tree, write_tree


def test_push_ls_show_rm(cli: Cli, tmp_path: Path) -> None:
    cli.login_as("ann")
    random_tree(tmp_path / "cat_images", 50, 1000)
    pushed = cli("dataset", "push", str(tmp_path / "cat_images"))  # the name from the directory
    assert pushed.exit_code == 0, pushed.output
    assert "pushed cat_images v1: 50 files" in pushed.stdout
    assert "the rest was on the server" not in pushed.stdout  # all of it was sent
    assert "50/50 files" in pushed.stderr  # the progress bar
    again = json.loads(
        cli(
            "dataset", "push", str(tmp_path / "cat_images"), "--name", "cat_images", "-o", "json"
        ).stdout
    )
    # the same files: nothing sent, no new version
    assert again["sent_bytes"] == 0 and again["dataset"]["current_version"] == 1
    (tmp_path / "cat_images" / "class_0" / "img_00000.bin").write_bytes(b"changed")
    changed = cli("dataset", "push", str(tmp_path / "cat_images"))
    assert "pushed cat_images v2: 50 files" in changed.stdout
    assert "(the rest was on the server already)" in changed.stdout  # one file's chunk sent

    listing = cli("dataset", "ls")
    assert "cat_images" in listing.stdout and "v2" in listing.stdout and "50" in listing.stdout
    assert "storage:" in listing.stderr and "of 50 GB" in listing.stderr
    data = json.loads(cli("dataset", "ls", "-o", "json").stdout)
    assert [d["name"] for d in data["datasets"]] == ["cat_images"]

    shown = cli("dataset", "show", "cat_images")
    assert "/data/cat_images (read-only)" in shown.stdout and "committed" in shown.stdout
    detail = json.loads(cli("dataset", "show", "cat_images", "-o", "json").stdout)
    assert [v["number"] for v in detail["versions"]] == [2, 1]

    created = cli("instance", "create", "--name", "box", "--dataset", "cat_images", "-o", "json")
    assert json.loads(created.stdout)["datasets"] == {"cat_images": 2}
    assert "/data/cat_images (v2)" in cli("instance", "show", "box").stdout
    refused = cli("dataset", "rm", "cat_images")
    assert refused.exit_code == 1 and "mounted by instance(s) box" in refused.stderr
    cli("instance", "release", "box")
    removed = cli("dataset", "rm", "cat_images")
    assert removed.exit_code == 0 and "removed dataset cat_images" in removed.stdout
    assert "no datasets" in cli("dataset", "ls").stderr


def test_bad_directories_are_refused_before_anything_is_sent(cli: Cli, tmp_path: Path) -> None:
    cli.login_as("ann")
    outside = write_tree(tmp_path / "outside", {"secret": b"x"})
    tree = write_tree(tmp_path / "d", {"ok.txt": b"ok"})
    os.symlink(outside / "secret", tree / "link")
    result = cli("dataset", "push", str(tree), "--name", "d")
    assert result.exit_code == 1
    assert "link" in result.stderr and "outside the directory" in result.stderr
    (tree / "link").unlink()
    (tree / "bad\x1bname").write_bytes(b"x")
    result = cli("dataset", "push", str(tree), "--name", "d")
    assert result.exit_code == 1 and "control character" in result.stderr
    (tree / "bad\x1bname").unlink()
    result = cli("dataset", "push", str(tree), "--name", "Bad Name")
    assert result.exit_code == 1 and "not a valid dataset name" in result.stderr
    result = cli("dataset", "push", str(tmp_path / "missing"), "--name", "d")
    assert result.exit_code == 1 and "not a directory" in result.stderr
    assert "no datasets" in cli("dataset", "ls").stderr
    nope = cli("instance", "create", "--dataset", "nope")
    assert nope.exit_code == 1 and "you have no dataset 'nope'" in nope.stderr
