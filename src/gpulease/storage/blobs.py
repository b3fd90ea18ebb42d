"""Blob stores behind one interface: local files (the default) and S3-compatible buckets.

Keys are '/'-separated strings such as `u/5/<sha256>/<gen>`. Stores hold opaque bytes (the
callers encrypt before they put); they never interpret them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, unquote

from gpulease.storage.buffers import BufferPool

log = logging.getLogger(__name__)


class BlobNotFound(KeyError):
    """get() of a key the store does not hold."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key

    def __str__(self) -> str:
        return f"blob {self.key!r} is not in the store"


class BlobStore(Protocol):
    """Where encrypted chunks and manifests live.

    put() is idempotent: putting a key again replaces its bytes whole (readers see the old
    or the new bytes, never a mix). A put is durable only after the next sync() returns;
    callers record a blob in the database only after that. delete() of a missing key is a
    no-op. iterate() lists keys under a prefix, in no particular order.
    """

    name: str

    def put(self, key: str, data: bytes) -> None: ...

    def put_pieces(self, key: str, pieces: Sequence[bytes | memoryview]) -> None:
        """put() of the pieces joined, without the caller joining them."""
        ...

    def get(self, key: str) -> bytes: ...

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes [offset, offset+length) of the blob for each (offset, length)."""
        ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None: ...

    def iterate(self, prefix: str = "") -> Iterator[str]: ...

    def sync(self) -> None: ...


# put_pieces() writes blobs of at least this many bytes with O_DIRECT, in whole blocks of
# _BLOCK bytes (a multiple of every common logical block size) from page-aligned buffers.
_DIRECT_MIN = 1 << 20
_BLOCK = 4096


# Two kept for the next blobs (a push sends two packs at a time), each up to a sealed
# dataset pack (16 MiB) or workspace pack (32 MiB): at most 80 MiB stay mapped.
_BUFFERS = BufferPool(keep=2, keep_bytes=40 << 20)


def _write_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def check_key(key: str) -> str:
    """Keys are printable, relative, without empty or dot segments."""
    if (
        not key
        or len(key) > 512
        or not key.isprintable()
        or key.startswith("/")
        or "//" in key
        or key.endswith("/")
        or any(part in (".", "..") for part in key.split("/"))
    ):
        raise ValueError(f"not a valid blob key: {key!r}")
    return key


class FsBlobStore:
    """Blobs as files under root, fanned out as root/abc/<quoted key> (abc: the first three
    hex digits of the SHA-256 of the key: 4,096 directories, a few thousand files each at
    ten million blobs), written to a temporary file and renamed into place (atomic).

    sync() makes the puts that its own thread made since its last sync() durable: an fsync
    of each file and of each directory it was renamed into. (A syncfs of the whole
    filesystem is one call, but it also writes out every other program's dirty pages: the
    tree a renter just wrote, or another tenant's.)"""

    name = "fs"

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._root = str(root)
        self._made: set[str] = set()
        self._lock = threading.Lock()
        self._pending = threading.local()  # .paths: this thread's puts not synced yet
        self._direct = True  # until the file system refuses O_DIRECT

    def _path(self, key: str) -> str:
        digest = hashlib.sha256(check_key(key).encode()).hexdigest()
        return f"{self._root}/{digest[:3]}/{quote(key, safe='')}"

    def path_of(self, key: str) -> Path:
        return Path(self._path(key))

    def put(self, key: str, data: bytes) -> None:
        with memoryview(data) as view:
            self._put(key, lambda fd: _write_all(fd, view, 0))

    def put_pieces(self, key: str, pieces: Sequence[bytes | memoryview]) -> None:
        """Large blobs (a pack of chunks) are written with O_DIRECT from a reused buffer:
        copying them into the page cache took the server more CPU than sealing them (on
        a virtual machine, pages not touched lately are slow to fill), and a blob is
        fsynced right after its put anyway; nothing reads a pack back soon. Small blobs,
        and file systems that refuse O_DIRECT, take put()."""
        total = sum(len(piece) for piece in pieces)
        if total < _DIRECT_MIN or not self._direct:
            self.put(key, b"".join(pieces))
            return
        padded = -(-total // _BLOCK) * _BLOCK
        buffer = _BUFFERS.take(padded)
        try:
            view = memoryview(buffer)[:padded]
            try:
                at = 0
                for piece in pieces:
                    view[at : at + len(piece)] = piece
                    at += len(piece)
                view[total:] = bytes(padded - total)  # no stale bytes past the end
                self._put(key, lambda fd: self._write_direct(fd, view, total))
            finally:
                view.release()
        finally:
            _BUFFERS.give(buffer)

    def _write_direct(self, fd: int, view: memoryview, total: int) -> None:
        """Write view (whole blocks) past the page cache, then cut the file to total bytes.
        Where the file system refuses O_DIRECT, or a write comes back short of a block
        boundary, the rest is written the usual way."""
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._direct = False  # one root, one file system: do not ask again
            _write_all(fd, view[:total], 0)
            return
        at = 0
        try:
            while at < len(view):
                at += os.pwrite(fd, view[at:], at)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)
            if at < total:
                _write_all(fd, view[at:total], at)
        os.ftruncate(fd, total)

    def _put(self, key: str, write: Callable[[int], None]) -> None:
        path = self._path(key)
        parent = path.rsplit("/", 1)[0]
        if parent not in self._made:
            os.makedirs(parent, mode=0o700, exist_ok=True)
            self._unsynced().append(parent)  # its entry in root is synced too
            with self._lock:
                self._made.add(parent)
        temporary = f"{parent}/.{secrets.token_hex(8)}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                write(fd)
            finally:
                os.close(fd)
            os.replace(temporary, path)
            self._unsynced().append(path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def get(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as source:
                return source.read()
        except FileNotFoundError:
            raise BlobNotFound(key) from None

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError:
            raise BlobNotFound(key) from None
        try:
            found = [os.pread(fd, length, offset) for offset, length in ranges]
        finally:
            os.close(fd)
        if any(len(data) != length for data, (_, length) in zip(found, ranges, strict=True)):
            raise BlobNotFound(f"{key} (shorter than a range asked of it)")
        return found

    def exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(key))

    def iterate(self, prefix: str = "") -> Iterator[str]:
        if not self.root.is_dir():
            return
        with os.scandir(self._root) as tops:
            directories = sorted(top.path for top in tops if top.is_dir())
        for directory in directories:
            with os.scandir(directory) as entries:
                names = [entry.name for entry in entries if not entry.name.startswith(".")]
            for name in names:  # a name with a dot first is a put in progress
                key = unquote(name)
                if key.startswith(prefix):
                    yield key

    def _unsynced(self) -> list[str]:
        paths: list[str] | None = getattr(self._pending, "paths", None)
        if paths is None:
            paths = self._pending.paths = []
        return paths

    def sync(self) -> None:
        paths = self._unsynced()
        directories = {path.rsplit("/", 1)[0] for path in paths}
        for path in [*dict.fromkeys(paths), *sorted(directories)]:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # deleted since its put: nothing to keep
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        paths.clear()


class S3BlobStore:
    """Blobs as objects of one bucket (under an optional prefix) of any S3-compatible
    service: AWS S3, MinIO, Ceph RGW, Garage. Credentials come the usual boto3 ways
    (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, an instance role)."""

    name = "s3"

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
    ) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._client = client or boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            config=Config(retries={"max_attempts": 5, "mode": "standard"}),
        )

    def _object(self, key: str) -> str:
        return self.prefix + check_key(key)

    def put(self, key: str, data: bytes) -> None:
        self._client.put_object(Bucket=self.bucket, Key=self._object(key), Body=data)

    def put_pieces(self, key: str, pieces: Sequence[bytes | memoryview]) -> None:
        self.put(key, b"".join(pieces))

    def get(self, key: str) -> bytes:
        return self._get_object(key)

    def _get_object(self, key: str, **extra: str) -> bytes:
        """The body of one GET of key (extra: such as Range); BlobNotFound when it is not
        there."""
        from botocore.exceptions import ClientError

        try:
            answer = self._client.get_object(Bucket=self.bucket, Key=self._object(key), **extra)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise BlobNotFound(key) from None
            raise
        body = answer["Body"]
        try:
            data = body.read()
        finally:
            body.close()
        assert isinstance(data, bytes)
        return data

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """One ranged GET spanning all the ranges (chunks asked together usually lie side
        by side in a pack), sliced here."""
        if not ranges:
            return []
        start = min(offset for offset, _ in ranges)
        end = max(offset + length for offset, length in ranges)
        if end <= start:
            return [b"" for _ in ranges]
        data = self._get_object(key, Range=f"bytes={start}-{end - 1}")
        found = [data[offset - start : offset - start + length] for offset, length in ranges]
        if any(len(piece) != length for piece, (_, length) in zip(found, ranges, strict=True)):
            raise BlobNotFound(f"{key} (shorter than a range asked of it)")
        return found

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.head_object(Bucket=self.bucket, Key=self._object(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise
        return True

    def delete(self, key: str) -> None:
        self._client.delete_object(Bucket=self.bucket, Key=self._object(key))

    def iterate(self, prefix: str = "") -> Iterator[str]:
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + prefix
        )
        for page in pages:
            for item in page.get("Contents", []):
                yield str(item["Key"])[len(self.prefix) :]

    def sync(self) -> None:
        """Nothing to do: S3 acknowledges a PUT once the object is durable."""
