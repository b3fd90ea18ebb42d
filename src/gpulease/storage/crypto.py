"""AES-256-GCM sealing of chunks, manifests and keys, and the master key file.

A sealed blob is `0x01 | 12-byte random nonce | ciphertext | 16-byte tag`. Every seal names
what it protects in its associated data (AAD), so a blob or a wrapped key moved to another
place (another user's chunk, another dataset's manifest) fails to open instead of being
read as something else. Which keys exist and how they nest is explained in
gpulease.server.services.datasets.keys.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpulease.core.errors import GpuleaseError

KEY_BYTES = 32
NONCE_BYTES = 12
FORMAT = b"\x01"
OVERHEAD = len(FORMAT) + NONCE_BYTES + 16


class IntegrityError(GpuleaseError):
    """A sealed blob or key did not open: altered, corrupted, or opened with the wrong key."""

    status = 500


class KeyFileError(GpuleaseError):
    """The master key file is missing, unreadable, malformed, open to other users, or not
    the one this database's keys are wrapped with."""

    status = 500


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    return b"".join(seal_pieces(key, plaintext, aad))


def seal_pieces(key: bytes, plaintext: bytes, aad: bytes) -> tuple[bytes, bytes]:
    """seal() as (format and nonce, ciphertext and tag): a caller writing thousands of seals
    into one pack joins them once instead of copying each seal together first."""
    nonce = os.urandom(NONCE_BYTES)
    return FORMAT + nonce, AESGCM(key).encrypt(nonce, plaintext, aad)


def seal_many(sealings: Sequence[tuple[bytes, bytes | memoryview, bytes]]) -> list[bytes]:
    """seal() of each (key, plaintext, aad), as two pieces each (format and nonce,
    ciphertext and tag), to be joined by the caller: the thousands of chunks of a pack, their
    nonces drawn from the operating system's random source in one call instead of one each.
    The seals are those seal() makes, byte for byte in format."""
    nonces = os.urandom(NONCE_BYTES * len(sealings))
    pieces: list[bytes] = []
    append = pieces.append
    for at, (key, plaintext, aad) in enumerate(sealings):
        nonce = nonces[at * NONCE_BYTES : (at + 1) * NONCE_BYTES]
        append(FORMAT + nonce)
        append(AESGCM(key).encrypt(nonce, plaintext, aad))
    return pieces


def open_sealed(key: bytes, sealed: bytes | memoryview, aad: bytes, what: str) -> bytes:
    """The plaintext of a seal() result; IntegrityError naming `what` when it does not open.
    sealed may be a view into a larger buffer (a chunk pack): it is opened without a copy."""
    return _open_with(AESGCM(key), sealed, aad, what)


def _open_with(aead: AESGCM, sealed: bytes | memoryview, aad: bytes, what: str) -> bytes:
    if len(sealed) < OVERHEAD or sealed[:1] != FORMAT:
        raise IntegrityError(f"{what} is not a sealed gpulease blob (wrong format or truncated)")
    view = memoryview(sealed)
    try:
        return aead.decrypt(view[1 : 1 + NONCE_BYTES], view[1 + NONCE_BYTES :], aad)
    except InvalidTag:
        raise IntegrityError(
            f"{what} failed its integrity check (AES-GCM tag mismatch): the stored bytes were "
            "altered or corrupted, or it was sealed under another key"
        ) from None


class KeyWrapper:
    """Wraps and unwraps keys under one key-encryption key (seals bound to each key's scope:
    'user:5', 'dataset:3'), setting AES up once for the thousands of chunk keys of a push."""

    def __init__(self, kek: bytes) -> None:
        self._aead = AESGCM(kek)

    def wrap(self, key: bytes, scope: str) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return FORMAT + nonce + self._aead.encrypt(nonce, key, _key_aad(scope))

    def wrap_new_keys(self, scopes: Sequence[str]) -> list[bytes]:
        """A fresh random key for each scope, wrapped (as wrap() does): the thousands of
        chunk keys of a file list, their keys and nonces drawn from the operating system's
        random source in one call instead of two each."""
        drawn = os.urandom((KEY_BYTES + NONCE_BYTES) * len(scopes))
        wrapped = []
        at = 0
        for scope in scopes:
            key = drawn[at : at + KEY_BYTES]
            nonce = drawn[at + KEY_BYTES : at + KEY_BYTES + NONCE_BYTES]
            at += KEY_BYTES + NONCE_BYTES
            wrapped.append(FORMAT + nonce + self._aead.encrypt(nonce, key, _key_aad(scope)))
        return wrapped

    def unwrap(self, wrapped: bytes, scope: str) -> bytes:
        key = _open_with(self._aead, wrapped, _key_aad(scope), f"the {scope} key")
        if len(key) != KEY_BYTES:
            raise IntegrityError(f"the {scope} key has {len(key)} bytes, not {KEY_BYTES}")
        return key


def _key_aad(scope: str) -> bytes:
    return b"gpulease/key/" + scope.encode()


def wrap_key(kek: bytes, key: bytes, scope: str) -> bytes:
    """key sealed under the key-encryption key kek, bound to scope ('user:5', 'dataset:3')."""
    return KeyWrapper(kek).wrap(key, scope)


def unwrap_key(kek: bytes, wrapped: bytes, scope: str) -> bytes:
    return KeyWrapper(kek).unwrap(wrapped, scope)


@dataclass(frozen=True)
class MasterKey:
    """The key that wraps every other key. `key_id` names it in the database without
    revealing anything about it."""

    secret: bytes

    @property
    def key_id(self) -> str:
        return hashlib.sha256(b"gpulease master key id\0" + self.secret).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"MasterKey(key_id={self.key_id!r})"


def _check_private(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise KeyFileError(
            f"the master key file {path} can be read by other users (mode {mode:04o}); "
            f"run `chmod 600 {path}`"
        )


def read_master_key(path: Path) -> MasterKey:
    """The key in path: 64 hex characters (a trailing newline is fine), mode 0600."""
    try:
        _check_private(path)
        text = path.read_text().strip()
    except FileNotFoundError:
        raise KeyFileError(f"the master key file {path} does not exist") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read the master key file {path}: {exc}") from exc
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) != KEY_BYTES:
        raise KeyFileError(f"the master key file {path} must hold 64 hex characters (256 bits)")
    return MasterKey(secret)


def write_master_key(path: Path, key: MasterKey) -> None:
    """Write key to path atomically (a temporary file, fsync, rename), mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(key.secret.hex() + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_or_create_master_key(path: Path) -> tuple[MasterKey, bool]:
    """The master key in path, made (256 random bits, mode 0600) when the file does not
    exist yet. Returns (key, created)."""
    if path.exists():
        return read_master_key(path), False
    key = MasterKey(new_key())
    write_master_key(path, key)
    return key, True


def pending_key_path(path: Path) -> Path:
    """Where a rotation keeps the new master key until the database has committed to it."""
    return path.with_name(path.name + ".new")
