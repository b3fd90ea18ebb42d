"""Safe extraction of the workdir archive a user uploaded into the instance's workspace."""

from __future__ import annotations

import tarfile
from pathlib import Path, PurePosixPath

from gpulease.runner import safefs


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
    nothing is written when one member is refused. Returns the number of files.

    The workspace is the job's, and a job of an earlier start may have left links in it:
    every member is written through runner/safefs.py, so a link at any component of its
    path is refused (UnsafeArchive), and a file is written anew and renamed into place
    (a link or FIFO where it goes is replaced, not followed). Files get mode 0644, or
    0755 when the archive marks them executable, and its mtime; no set-uid bit, no owner
    from the archive.
    """
    workspace.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                check_member(member)
            for member in members:
                _extract(tar, member, workspace)
    except tarfile.TarError as exc:
        raise UnsafeArchive(f"workdir archive cannot be read: {exc}") from exc
    except safefs.UnsafePath as exc:
        raise UnsafeArchive(
            f"workdir archive: {exc.message} in the workspace; remove it and start again"
        ) from exc
    return sum(1 for member in members if member.isfile())


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, workspace: Path) -> None:
    if member.isdir():
        if safefs.parts(member.name):  # "." is the workspace itself
            safefs.makedirs(workspace, member.name)
        return
    data = tar.extractfile(member)
    if data is None:  # not reached: check_member lets only files and directories through
        raise UnsafeArchive(f"workdir archive: {member.name!r} has no data")
    with data:
        mode = 0o755 if member.mode & 0o100 else 0o644
        safefs.write_replace(workspace, member.name, data, mode, mtime=member.mtime)
