"""Password hashing (argon2) and bearer-token secrets (random, stored as SHA-256)."""

from __future__ import annotations

import hashlib
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_hasher = PasswordHasher()

TOKEN_PREFIX = "glp_"
RUNNER_TOKEN_PREFIX = "glr_"


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


def new_token(prefix: str = TOKEN_PREFIX) -> str:
    """A 256-bit secret. Shown to its owner once; only its hash is stored."""
    return prefix + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    # Tokens carry 256 bits of entropy, so a fast hash is safe here (unlike passwords) and
    # lets every request look its token up by index.
    return hashlib.sha256(token.encode()).hexdigest()
