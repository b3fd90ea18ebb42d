"""The workdir archive is extracted only when every member stays inside the workspace."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import httpx
import pytest

from gpulease.runner.agent import _server_says
from gpulease.runner.workdir import UnsafeArchive, extract_workdir


def make_tar(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                name, data = member
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def special(name: str, kind: bytes, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def test_files_and_directories_are_extracted(tmp_path: Path) -> None:
    folder = special("src", tarfile.DIRTYPE)
    archive = make_tar(
        tmp_path / "w.tgz", [folder, ("src/train.py", b"print(1)\n"), ("./README", b"hi")]
    )

    count = extract_workdir(archive, tmp_path / "ws")

    assert count == 2
    assert (tmp_path / "ws" / "src" / "train.py").read_text() == "print(1)\n"
    assert (tmp_path / "ws" / "README").read_text() == "hi"
    assert (tmp_path / "ws" / "README").stat().st_mtime == 0  # the archive's, as tar would


def test_executable_files_stay_executable_and_nothing_else_is(tmp_path: Path) -> None:
    archive = tmp_path / "w.tar"
    with tarfile.open(archive, "w") as tar:
        for name, mode in (("run.sh", 0o4775), ("data.csv", 0o666)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = 2, mode
            tar.addfile(info, io.BytesIO(b"ok"))
    extract_workdir(archive, tmp_path / "ws")
    assert (tmp_path / "ws" / "run.sh").stat().st_mode & 0o7777 == 0o755
    assert (tmp_path / "ws" / "data.csv").stat().st_mode & 0o7777 == 0o644


@pytest.mark.parametrize(
    ("member", "words"),
    [
        (("/etc/evil", b"x"), "absolute path"),
        (("../evil", b"x"), "'..'"),
        (("src/../../evil", b"x"), "'..'"),
        (special("link", tarfile.SYMTYPE, "/etc/passwd"), "is a link"),
        (special("inside", tarfile.SYMTYPE, "README"), "is a link"),
        (special("hard", tarfile.LNKTYPE, "README"), "is a link"),
        (special("fifo", tarfile.FIFOTYPE), "not a regular file"),
        (special("dev", tarfile.CHRTYPE), "not a regular file"),
    ],
)
def test_unsafe_members_refuse_the_whole_archive(
    tmp_path: Path, member: tarfile.TarInfo | tuple[str, bytes], words: str
) -> None:
    archive = make_tar(tmp_path / "w.tgz", [("README", b"hi"), member])

    with pytest.raises(UnsafeArchive) as caught:
        extract_workdir(archive, tmp_path / "ws")

    assert words in caught.value.message
    assert not (tmp_path / "ws" / "README").exists()  # nothing was written
    assert not (tmp_path / "evil").exists()


def test_a_link_already_in_the_workspace_is_not_followed(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    outside = tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    os.symlink(outside, workspace / "data")
    archive = make_tar(tmp_path / "w.tgz", [("data/planted", b"x")])

    with pytest.raises(UnsafeArchive):
        extract_workdir(archive, workspace)
    assert not (outside / "planted").exists()


def test_a_broken_archive_is_explained(tmp_path: Path) -> None:
    archive = tmp_path / "w.tgz"
    archive.write_bytes(b"this is not a tar file")

    with pytest.raises(UnsafeArchive, match="cannot be read"):
        extract_workdir(archive, tmp_path / "ws")


def test_a_refused_fetch_says_the_servers_reason() -> None:
    gone = httpx.Response(410, json={"detail": "the workdir … is no longer on the server"})
    assert _server_says(gone) == "the workdir … is no longer on the server"
    assert _server_says(httpx.Response(502, text="<html>bad gateway")) == "<html>bad gateway"
    assert (
        _server_says(httpx.Response(400, json=["not", "an", "object"])) == '["not","an","object"]'
    )
