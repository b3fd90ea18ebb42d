"""Wire models for users, logins and API tokens."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from gpulease.schemas.base import Model


class UserPublic(Model):
    id: int
    name: str
    role: str
    created_at: datetime
    timezone: str = "UTC"


class RegisterRequest(BaseModel):
    name: str = Field(max_length=64)
    password: str = Field(max_length=1024)
    email: str | None = Field(default=None, max_length=254)


class LoginRequest(BaseModel):
    name: str = Field(max_length=64)
    password: str = Field(max_length=1024)
    token_name: str = Field(default="cli login", max_length=100)


class TokenPublic(Model):
    id: int
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class TokenCreate(BaseModel):
    name: str = Field(max_length=100)
    # Needed when the caller is the browser's session cookie (not a bearer token): script
    # on a page the browser trusts must not mint a permanent token silently.
    password: str | None = Field(default=None, max_length=1024)


class TokenCreated(BaseModel):
    token: str
    info: TokenPublic


class AuthResult(BaseModel):
    token: str
    user: UserPublic


class FailedLoginPublic(BaseModel):
    """A failed or refused login, for admins: who was tried, from where, why it failed."""

    at: datetime
    name: str
    address: str
    reason: str
