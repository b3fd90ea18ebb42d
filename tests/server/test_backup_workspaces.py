"""A workspace is written by its jobs: backing it up follows none of its links, blocks on
none of its FIFOs and archives what was opened, nothing of the host outside it."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from gpulease.server.backups.progress import no_progress
from gpulease.server.backups.snapshot import _write_tar


def test_links_fifos_and_hard_links_in_a_workspace_stay_what_they_are(tmp_path: Path) -> None:
    key = tmp_path / "home" / "keys" / "master.key"
    key.parent.mkdir(parents=True)
    key.write_text("the master key")
    workspace = tmp_path / "home" / "workspaces" / "7"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "sub" / "notes.txt").write_text("epoch 3")
    os.link(workspace / "sub" / "notes.txt", workspace / "notes-again.txt")
    (workspace / "key").symlink_to(key)
    (workspace / "keys").symlink_to(key.parent)
    os.mkfifo(workspace / "fifo")  # opening it to read would block the backup forever

    archive = tmp_path / "workspaces.tar"
    _write_tar(archive, [(workspace, "7")], no_progress("archiving", None))

    with tarfile.open(archive) as tar:
        members = {member.name: member for member in tar.getmembers()}
        assert sorted(members) == [
            "7",
            "7/key",
            "7/keys",
            "7/notes-again.txt",
            "7/sub",
            "7/sub/notes.txt",
        ]  # no 7/fifo, nothing under 7/keys
        assert members["7/notes-again.txt"].isreg() and members["7/sub/notes.txt"].islnk()
        assert members["7/key"].issym() and members["7/key"].linkname == str(key)
        assert members["7/keys"].issym()
        contents = b"".join(
            data.read()
            for m in members.values()
            if m.isreg() and (data := tar.extractfile(m)) is not None
        )
    assert b"the master key" not in contents
    assert b"epoch 3" in contents


def test_a_workspace_that_is_itself_a_link_is_archived_as_a_link(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "db").write_text("the database")
    link = tmp_path / "workspaces" / "8"
    link.parent.mkdir()
    link.symlink_to(secret)
    archive = tmp_path / "w.tar"
    _write_tar(archive, [(link, "8")], no_progress("archiving", None))
    with tarfile.open(archive) as tar:
        assert [(m.name, m.issym()) for m in tar.getmembers()] == [("8", True)]
