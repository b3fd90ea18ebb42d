"""Pack a task's workdir into the gzip'd tar that the runner unpacks into the workspace."""

from __future__ import annotations

import os
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from gpulease.client.closing import Closing
from gpulease.client.errors import WorkdirError

SKIP_DIRS = frozenset({".git", "__pycache__", ".venv"})
# The server refuses bigger uploads; checking here saves sending half a gigabyte for nothing.
MAX_WORKDIR_BYTES = 512 * 1024 * 1024
_IN_MEMORY_BYTES = 16 * 1024 * 1024
_CHUNK_BYTES = 1024 * 1024


class WorkdirArchive(Closing):
    """A packed workdir: gzip'd tar bytes, in memory while small, in a temporary file after."""

    def __init__(self, file: IO[bytes], size: int, files: int) -> None:
        self.file = file
        self.size = size
        self.files = files

    def chunks(self) -> Iterator[bytes]:
        """The archive from its start, in 1 MiB pieces (for a streamed upload)."""
        self.file.seek(0)
        while chunk := self.file.read(_CHUNK_BYTES):
            yield chunk

    def read(self) -> bytes:
        self.file.seek(0)
        return self.file.read()

    def close(self) -> None:
        self.file.close()


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class _Packer:
    """Walks the workdir; links are stored as the files they point to (the runner refuses
    link members), and only when they point inside the workdir."""

    def __init__(self, tar: tarfile.TarFile, out: IO[bytes], root: Path) -> None:
        self.tar = tar
        self.out = out
        self.root = root
        self.files = 0

    def add(self, path: Path, arcname: str) -> None:
        self.tar.add(path, arcname=arcname, recursive=False, filter=_anonymous)
        if self.out.tell() > MAX_WORKDIR_BYTES:
            raise WorkdirError(
                f"the workdir {self.root} packs to more than 512 MiB, the server's limit; "
                "keep datasets and checkpoints out of it (upload big data as a dataset)"
            )

    def walk(self, real_dir: Path, prefix: str, chain: tuple[Path, ...]) -> None:
        with os.scandir(real_dir) as scan:
            entries = sorted(scan, key=lambda e: e.name)
        for entry in entries:
            arcname = prefix + entry.name
            path = Path(entry.path)
            if entry.is_symlink():
                self._link(path, arcname, chain)
            elif entry.is_dir(follow_symlinks=False):
                if entry.name in SKIP_DIRS:
                    continue
                self.add(path, arcname)
                self.walk(path, arcname + "/", (*chain, path))
            elif entry.is_file(follow_symlinks=False):
                self.add(path, arcname)
                self.files += 1
            # sockets, fifos and devices are not files a job can use: left out

    def _link(self, path: Path, arcname: str, chain: tuple[Path, ...]) -> None:
        try:
            target = path.resolve()
        except (OSError, RuntimeError) as exc:  # a link loop
            raise WorkdirError(f"{arcname} in the workdir is a link that loops: {exc}") from exc
        if not target.is_relative_to(self.root):
            raise WorkdirError(
                f"{arcname} in the workdir is a link to {target}, outside the workdir; "
                "copy what it points to into the workdir or remove the link"
            )
        if target.is_dir():
            if path.name in SKIP_DIRS:
                return
            if any(seen.is_relative_to(target) for seen in chain):
                raise WorkdirError(
                    f"{arcname} in the workdir links to a directory that contains it; "
                    "remove the link"
                )
            self.add(target, arcname)
            self.walk(target, arcname + "/", (*chain, target))
        elif target.is_file():
            self.add(target, arcname)
            self.files += 1
        elif not target.exists():
            raise WorkdirError(
                f"{arcname} in the workdir is a broken link (to {target}); remove or fix it"
            )


def pack_workdir(directory: Path) -> WorkdirArchive:
    """A gzip'd tar of `directory`'s contents (member names relative to it), leaving out
    .git, __pycache__ and .venv. Refuses links that lead outside the directory."""
    if not directory.exists():
        raise WorkdirError(f"the workdir {directory} does not exist")
    if not directory.is_dir():
        raise WorkdirError(f"the workdir {directory} is not a directory")
    root = directory.resolve()
    out: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_IN_MEMORY_BYTES)  # noqa: SIM115
    try:
        with tarfile.open(fileobj=out, mode="w:gz", compresslevel=6, dereference=True) as tar:
            packer = _Packer(tar, out, root)
            packer.walk(root, "", (root,))
        size = out.tell()
    except PermissionError as exc:
        out.close()
        raise WorkdirError(f"cannot read {exc.filename} in the workdir: permission denied") from exc
    except BaseException:
        out.close()
        raise
    return WorkdirArchive(out, size, packer.files)
