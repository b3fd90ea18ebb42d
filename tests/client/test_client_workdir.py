"""Packing a workdir: what goes in, what is left out, and which links are refused."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from inprocess import tar_members

from gpulease.client import WorkdirError, pack_workdir


def pack(directory: Path) -> dict[str, bytes | None]:
    with pack_workdir(directory) as archive:
        return tar_members(archive.read())


def test_files_and_directories_are_packed_relative_to_the_workdir(tmp_path: Path) -> None:
    (tmp_path / "src" / "empty").mkdir(parents=True)
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "src" / "model.py").write_bytes(b"\x00binary\xff")
    for skipped in (".git", "__pycache__", ".venv", "src/__pycache__"):
        (tmp_path / skipped).mkdir(parents=True, exist_ok=True)
        (tmp_path / skipped / "junk").write_text("x")
    (tmp_path / ".gitignore").write_text("*.pt\n")  # only the directories named are skipped

    with pack_workdir(tmp_path) as archive:
        members = tar_members(archive.read())
        assert archive.files == 3 and archive.size == len(archive.read())
    assert members == {
        ".gitignore": b"*.pt\n",
        "src": None,
        "src/empty": None,
        "src/model.py": b"\x00binary\xff",
        "train.py": b"print(1)\n",
    }


def test_links_inside_are_stored_as_what_they_point_to(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.csv").write_text("1\n")
    (tmp_path / "latest.csv").symlink_to("data/a.csv")
    (tmp_path / "alias").symlink_to("data", target_is_directory=True)
    members = pack(tmp_path)
    assert members["latest.csv"] == b"1\n"
    assert members["alias/a.csv"] == b"1\n"


def test_links_leading_outside_are_refused(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "secret").write_text("key")
    (work / "stolen").symlink_to(tmp_path / "secret")
    with pytest.raises(WorkdirError, match="stolen .*outside the workdir"):
        pack_workdir(work)
    (work / "stolen").unlink()
    (work / "up").symlink_to("..", target_is_directory=True)
    with pytest.raises(WorkdirError, match="outside the workdir"):
        pack_workdir(work)


def test_broken_and_looping_links_are_refused(tmp_path: Path) -> None:
    (tmp_path / "gone").symlink_to("nothing-here")
    with pytest.raises(WorkdirError, match="broken link"):
        pack_workdir(tmp_path)
    (tmp_path / "gone").unlink()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "loop").symlink_to("..", target_is_directory=True)
    with pytest.raises(WorkdirError, match="contains it"):
        pack_workdir(tmp_path)


def test_sockets_are_left_out(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    path = tmp_path / "s.sock"
    if len(os.fsencode(path)) > 100:
        pytest.skip("the temporary path is too long for a unix socket")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        assert pack(tmp_path) == {"a.txt": b"a"}


def test_a_missing_or_non_directory_workdir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkdirError, match="does not exist"):
        pack_workdir(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(WorkdirError, match="not a directory"):
        pack_workdir(tmp_path / "file")


def test_the_runner_accepts_what_is_packed(tmp_path: Path) -> None:
    """The contract with the runner: it refuses links and `..`, so packing never makes them."""
    from gpulease.runner.workdir import extract_workdir

    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "data" / "a.csv").write_text("1\n")
    (work / "alias.csv").symlink_to("data/a.csv")
    (work / "run.sh").write_text("#!/bin/sh\n")
    (work / "run.sh").chmod(0o755)
    archive_path = tmp_path / "workdir.tar.gz"
    with pack_workdir(work) as archive:
        archive_path.write_bytes(archive.read())
    workspace = tmp_path / "workspace"
    assert extract_workdir(archive_path, workspace) == 3
    assert (workspace / "alias.csv").read_text() == "1\n"
    assert not (workspace / "alias.csv").is_symlink()
    assert os.access(workspace / "run.sh", os.X_OK)
