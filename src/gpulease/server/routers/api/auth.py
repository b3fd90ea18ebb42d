"""Accounts and tokens."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gpulease.core.errors import Forbidden
from gpulease.schemas.accounts import (
    AuthResult,
    FailedLoginPublic,
    LoginRequest,
    RegisterRequest,
    TokenCreate,
    TokenCreated,
    TokenPublic,
    UserPublic,
)
from gpulease.server.routers.auth_limits import (
    auth_guard,
    client_address,
    guarded_login,
    within_limits,
)
from gpulease.server.routers.deps import (
    AdminUser,
    CurrentUser,
    DetachedUser,
    IdPath,
    SessionDep,
    bearer,
    runtime,
    tx,
)
from gpulease.server.security import verify_password
from gpulease.server.services import tokens, users
from gpulease.server.services.ratelimit import TooManyAttempts

router = APIRouter(tags=["accounts"])


# The guard counts in transactions of its own, outside the request's: these routes open
# theirs only around the work between its check and its count.


@router.post("/auth/register", status_code=201)
def register(body: RegisterRequest, request: Request) -> AuthResult:
    settings = runtime(request).settings
    if not settings.signup_enabled:
        raise Forbidden("sign-up is closed on this server; ask an admin for an account")
    guard, address = auth_guard(request), client_address(request)
    within_limits(guard.check_registration, address)
    with tx(request) as session:
        user = users.create_user(
            session,
            body.name,
            body.password,
            email=body.email,
            signup_credit_micro=settings.signup_credit_micro,
        )
        secret, _ = tokens.create_token(session, user, "registration")
    guard.registered(address)
    return AuthResult(token=secret, user=UserPublic.model_validate(user))


@router.post("/auth/login")
def login(body: LoginRequest, request: Request) -> AuthResult:
    try:
        user = guarded_login(request, body.name, body.password)
    except TooManyAttempts as exc:
        raise exc.http() from None
    with tx(request) as session:
        secret, _ = tokens.create_token(session, user, body.token_name)
    return AuthResult(token=secret, user=UserPublic.model_validate(user))


@router.get("/me")
def me(user: CurrentUser) -> UserPublic:
    return UserPublic.model_validate(user)


@router.get("/tokens")
def list_tokens(session: SessionDep, user: CurrentUser) -> list[TokenPublic]:
    return [TokenPublic.model_validate(t) for t in tokens.list_tokens(session, user)]


@router.post("/tokens", status_code=201)
def create_token(body: TokenCreate, user: DetachedUser, request: Request) -> TokenCreated:
    if bearer(request) is None:  # the browser's cookie: confirm with the password
        _confirm_password(request, user.name, user.password_hash, body.password)
    with tx(request) as session:
        secret, row = tokens.create_token(session, user, body.name)
        return TokenCreated(token=secret, info=TokenPublic.model_validate(row))


@router.delete("/tokens/{token_id}", status_code=204)
def revoke_token(token_id: IdPath, session: SessionDep, user: CurrentUser) -> Response:
    tokens.revoke_token(session, user, token_id)
    return Response(status_code=204)


def _confirm_password(request: Request, name: str, password_hash: str, given: str | None) -> None:
    """A token minted through the session cookie needs the account's password, counted
    like a login so that it cannot be guessed either."""
    if not given:
        raise Forbidden(
            "creating an API token from the browser needs your password: send it as "
            "'password' (or use `gpulease token create`, which is logged in already)"
        )
    guard, address = auth_guard(request), client_address(request)
    within_limits(guard.check_login, name, address)
    if not verify_password(password_hash, given):
        guard.login_failed(name, address, "wrong password to create a token")
        raise Forbidden("wrong password; the token was not created")


@router.get("/admin/failed-logins")
def failed_logins(
    _: AdminUser, session: SessionDep, request: Request, limit: int = 100
) -> list[FailedLoginPublic]:
    """The latest failed and rate-limited logins, newest first."""
    found = auth_guard(request).failed_logins(session, max(1, min(limit, 1000)))
    return [
        FailedLoginPublic(at=f.at, name=f.name, address=f.address, reason=f.reason) for f in found
    ]
