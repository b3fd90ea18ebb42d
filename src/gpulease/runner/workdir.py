"""Safe extraction of the workdir archive a user uploaded into the instance's workspace."""

from __future__ import annotations

import tarfile
from pathlib import Path, PurePosixPath


class UnsafeArchive(Exception):
    """The workdir archive holds something that could write outside the workspace."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def check_member(member: tarfile.TarInfo) -> None:
    """Refuse absolute paths, `..`, links of any kind and special files."""
    name = member.name
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith(("/", "\\")):
        raise UnsafeArchive(f"workdir archive: {name!r} is an absolute path")
    if ".." in path.parts or ".." in name.split("\\"):
        raise UnsafeArchive(f"workdir archive: {name!r} points outside the workdir with '..'")
    if member.issym() or member.islnk():
        raise UnsafeArchive(f"workdir archive: {name!r} is a link; upload the file it points to")
    if not (member.isfile() or member.isdir()):
        raise UnsafeArchive(f"workdir archive: {name!r} is not a regular file or directory")


def extract_workdir(archive: Path, workspace: Path) -> int:
    """Extract archive (tar, gzip or not) into workspace after checking every member;
    nothing is written when one member is refused. Returns the number of files."""
    workspace.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                check_member(member)
            # The "data" filter also refuses paths that resolve outside the workspace
            # through links already in it, and drops set-uid bits and odd modes.
            tar.extractall(workspace, members=members, filter="data")
    except tarfile.TarError as exc:
        raise UnsafeArchive(f"workdir archive cannot be read: {exc}") from exc
    return sum(1 for member in members if member.isfile())
