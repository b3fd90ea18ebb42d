"""AES-256-GCM seals, key wrapping and the master key file."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gpulease.storage.crypto import (
    OVERHEAD,
    IntegrityError,
    KeyFileError,
    load_or_create_master_key,
    new_key,
    open_sealed,
    read_master_key,
    seal,
    unwrap_key,
    wrap_key,
)


def test_round_trip_and_fresh_nonces() -> None:
    key = new_key()
    sealed = seal(key, b"cat picture", b"u/1/abc")
    assert len(sealed) == len(b"cat picture") + OVERHEAD
    assert seal(key, b"cat picture", b"u/1/abc") != sealed  # a new nonce every time
    assert open_sealed(key, sealed, b"u/1/abc", "chunk") == b"cat picture"


@pytest.mark.parametrize("where", [0, 1, 13, -1, -17])
def test_a_flipped_byte_is_detected(where: int) -> None:
    key = new_key()
    sealed = bytearray(seal(key, b"x" * 100, b"aad"))
    sealed[where] ^= 0x40
    with pytest.raises(IntegrityError, match="chunk u/1/abc"):
        open_sealed(key, bytes(sealed), b"aad", "chunk u/1/abc")


def test_wrong_key_wrong_place_or_truncated_do_not_open() -> None:
    key = new_key()
    sealed = seal(key, b"data", b"gpulease/chunk/1/abc")
    with pytest.raises(IntegrityError, match="AES-GCM tag mismatch"):
        open_sealed(new_key(), sealed, b"gpulease/chunk/1/abc", "chunk")
    with pytest.raises(IntegrityError, match="AES-GCM tag mismatch"):
        open_sealed(key, sealed, b"gpulease/chunk/2/abc", "chunk")  # another user's place
    with pytest.raises(IntegrityError, match="truncated"):
        open_sealed(key, sealed[:10], b"gpulease/chunk/1/abc", "chunk")


def test_wrapped_keys_are_bound_to_their_scope() -> None:
    kek, key = new_key(), new_key()
    wrapped = wrap_key(kek, key, "dataset:3")
    assert unwrap_key(kek, wrapped, "dataset:3") == key
    with pytest.raises(IntegrityError, match="the dataset:4 key"):
        unwrap_key(kek, wrapped, "dataset:4")


def test_master_key_file(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "master.key"
    key, created = load_or_create_master_key(path)
    assert created and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    again, created = load_or_create_master_key(path)
    assert not created and again == key and len(key.key_id) == 16
    assert key.secret.hex() not in repr(key)
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        read_master_key(path)
    path.chmod(0o600)
    path.write_text("not hex\n")
    with pytest.raises(KeyFileError, match="64 hex characters"):
        read_master_key(path)
    with pytest.raises(KeyFileError, match="does not exist"):
        read_master_key(tmp_path / "nope.key")
