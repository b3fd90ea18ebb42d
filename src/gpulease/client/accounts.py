"""Accounts: register, log in, who you are, your time zone, API tokens."""

from __future__ import annotations

from gpulease.client.base import Resource
from gpulease.schemas.accounts import (
    AuthResult,
    LoginRequest,
    RegisterRequest,
    TokenCreate,
    TokenCreated,
    TokenPublic,
    UserPublic,
)
from gpulease.schemas.autostop import TimezoneUpdate


class AuthAPI(Resource):
    """`client.auth`: the account of the client's token."""

    def register(self, body: RegisterRequest) -> AuthResult:
        """Create an account; the answer carries a token for it (the client starts using it)."""
        result = self._api.one(AuthResult, "POST", "/auth/register", body=body)
        self._api.token = result.token
        return result

    def login(self, body: LoginRequest) -> AuthResult:
        """Trade a password for a new token (the client starts using it)."""
        result = self._api.one(AuthResult, "POST", "/auth/login", body=body)
        self._api.token = result.token
        return result

    def me(self) -> UserPublic:
        return self._api.one(UserPublic, "GET", "/me")

    def set_timezone(self, body: TimezoneUpdate) -> UserPublic:
        """Your time zone (an IANA name such as Europe/Berlin); schedules fire in it."""
        return self._api.one(UserPublic, "PUT", "/me/timezone", body=body)


class TokensAPI(Resource):
    """`client.tokens`: your API tokens."""

    def list(self) -> list[TokenPublic]:
        return self._api.many(TokenPublic, "/tokens")

    def create(self, body: TokenCreate) -> TokenCreated:
        """A new API token; its secret (`.token`) is shown this once only."""
        return self._api.one(TokenCreated, "POST", "/tokens", body=body)

    def revoke(self, token_id: int) -> None:
        self._api.send("DELETE", f"/tokens/{int(token_id)}")
