"""How far each materialised dataset version is known to be on the node's disk.

A version's files are written without an fsync each and the version is renamed into place
at once, so that an instance starts as soon as its files are in the page cache. Until the
kernel has written them back, a power cut can leave the renamed directory holding files the
disk never got (empty or short), and a cache that trusted every directory it finds would
hand them to every later instance. So each version has a mark in <cache>/.marks/<version>:

- ``built BOOT_ID``: written, and made durable, before the version is renamed into place:
  its files are in the page cache of the boot that built it, not known to be on the disk;
- ``synced``: written once syncfs() of the cache's file system has returned after that.

A version marked built in another boot (the host went down before its sync ended) is fetched
again. One marked built in this boot is used and synced again (the runner that built it may
have ended before its sync did). A version without a mark was materialised before marks
were kept: it is taken as built now, as it always was, and synced. Only the runner writes
here: the cache is not in any sandbox.
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import threading
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

MARKS = ".marks"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
SYNCED = "synced"
_BUILT = "built "
_MARK_BYTES = 128  # a mark is one short line; anything longer is not one of ours
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

State = Literal["synced", "this boot", "unmarked", "suspect"]

_syncing: dict[str, threading.Thread] = {}  # version -> its sync, in this process
_syncing_lock = threading.Lock()


def boot_id() -> str | None:
    """The kernel's id of this boot (a new one at every start of the host), None if unknown."""
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def state(root: Path, version: str) -> State:
    """What the mark of the version in the cache root says about its files."""
    try:
        fd = os.open(root / MARKS / version, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):  # no mark, or no .marks to hold one
        return "unmarked"
    except OSError:
        return "suspect"
    try:
        text = os.read(fd, _MARK_BYTES).decode("ascii", "replace").strip()
    except OSError:
        return "suspect"
    finally:
        os.close(fd)
    if text == SYNCED:
        return "synced"
    booted = boot_id()
    if booted is not None and text == _BUILT + booted:
        return "this boot"
    return "suspect"  # built in another boot, or a mark that is not ours (a torn write)


def usable(root: Path, version: str) -> bool:
    """Whether the version in the cache may be used as it is; a version not known to be on
    the disk yet is synced (in the background) on the way."""
    found = state(root, version)
    if found == "suspect":
        return False
    if found == "unmarked":
        try:
            mark_built(root, version)
        except OSError as exc:  # used as it always was; the next runner tries again
            log.warning("could not mark dataset version %s: %s", version, exc)
            return True
    if found != "synced":
        sync_later(root, version)
    return True


def mark_built(root: Path, version: str) -> None:
    """Marks the version as built in this boot, durably: call it before the rename that puts
    the version in place, so that a version in place always has its mark on the disk."""
    _write(root, version, _BUILT + (boot_id() or "unknown"))


def sync_later(root: Path, version: str) -> None:
    """Writes the cache's file system back to the disk on a thread of its own, then marks
    the version synced. The thread is not a daemon: the runner's exit waits for it."""
    with _syncing_lock:
        running = _syncing.get(version)
        if running is not None and running.is_alive():
            return
        thread = threading.Thread(
            target=_sync, args=(root, version), name=f"dataset-sync-{version}", daemon=False
        )
        _syncing[version] = thread
        thread.start()


def wait_for_syncs() -> None:
    """Waits for this process's syncs to end (tests, and a runner that wants them done)."""
    with _syncing_lock:
        threads = list(_syncing.values())
    for thread in threads:
        thread.join()


def _sync(root: Path, version: str) -> None:
    try:
        fd = os.open(root / version, _DIRECTORY)
        try:
            syncfs(fd)
        finally:
            os.close(fd)
        _write(root, version, SYNCED)
    except OSError as exc:  # it stays marked built: this boot uses it, the next fetches it
        log.warning("could not sync dataset version %s to the disk: %s", version, exc)


def syncfs(fd: int) -> None:
    """syncfs(2) of the file system that holds fd: every dirty page of it written back and
    waited for (ctypes lets go of the GIL for the call). os.sync() where libc has none."""
    call = getattr(_libc(), "syncfs", None)
    if call is None:
        os.sync()
        return
    if call(fd) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _write(root: Path, version: str, text: str) -> None:
    """The mark's text, replaced whole and made durable: the new file fsynced, renamed over
    the old one, the directory fsynced (and the cache's, when .marks is new)."""
    marks = root / MARKS
    try:
        marks.mkdir(mode=0o700)
        _fsync_directory(root)
    except FileExistsError:
        pass
    temporary = marks / f".{version}.{secrets.token_hex(4)}"
    fd = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        os.write(fd, f"{text}\n".encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, marks / version)
    _fsync_directory(marks)


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, _DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
