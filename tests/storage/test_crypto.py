"""AES-256-GCM seals, key wrapping and the master key file."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gpulease.storage.crypto import (
    OVERHEAD,
    IntegrityError,
    KeyFileError,
    KeyWrapper,
    load_or_create_master_key,
    new_key,
    open_sealed,
    read_master_key,
    seal,
    seal_many,
    unwrap_key,
    wrap_key,
)


def test_round_trip_and_fresh_nonces() -> None:
    key = new_key()
    sealed = seal(key, b"cat picture", b"u/1/abc")
    assert len(sealed) == len(b"cat picture") + OVERHEAD
    assert seal(key, b"cat picture", b"u/1/abc") != sealed  # a new nonce every time
    assert open_sealed(key, sealed, b"u/1/abc", "chunk") == b"cat picture"


def test_seal_many_makes_seals_that_open_like_seal() -> None:
    keys = [new_key(), new_key(), new_key()]
    body = memoryview(b"..first..second")  # plaintexts may be views into a pack
    plaintexts: list[bytes | memoryview] = [body[2:7], body[9:], b""]
    aads = [b"c/0", b"c/1", b"c/2"]
    pieces = seal_many(list(zip(keys, plaintexts, aads, strict=True)))
    sealed = [pieces[i] + pieces[i + 1] for i in range(0, len(pieces), 2)]
    assert len(sealed) == 3
    for i, (key, plaintext, one) in enumerate(zip(keys, plaintexts, sealed, strict=True)):
        assert len(one) == len(plaintext) + OVERHEAD
        assert open_sealed(key, one, aads[i], "chunk") == bytes(plaintext)
        with pytest.raises(IntegrityError):
            open_sealed(key, one, aads[i - 1], "chunk")
    assert len({one[1:13] for one in sealed}) == 3  # each seal its own nonce
    assert seal_many([]) == []


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


def test_fresh_keys_wrapped_in_bulk_are_distinct_and_bound_to_their_scopes() -> None:
    kek = new_key()
    scopes = ["chunk:1:aa", "chunk:1:bb", "chunk:2:aa"]
    wrapped = KeyWrapper(kek).wrap_new_keys(scopes)
    keys = [unwrap_key(kek, one, scope) for one, scope in zip(wrapped, scopes, strict=True)]
    assert len(set(keys)) == 3 and all(len(key) == 32 for key in keys)
    assert len({one[1:13] for one in wrapped}) == 3  # each its own nonce
    with pytest.raises(IntegrityError, match="the chunk:1:bb key"):
        unwrap_key(kek, wrapped[0], "chunk:1:bb")
    assert KeyWrapper(kek).wrap_new_keys([]) == []


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
