"""Accounts and tokens."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gpulease.core.errors import Forbidden
from gpulease.schemas.accounts import (
    AuthResult,
    LoginRequest,
    RegisterRequest,
    TokenCreate,
    TokenCreated,
    TokenPublic,
    UserPublic,
)
from gpulease.server.routers.deps import current_user, runtime, tx
from gpulease.server.services import tokens, users

router = APIRouter(tags=["accounts"])


@router.post("/auth/register", status_code=201)
def register(body: RegisterRequest, request: Request) -> AuthResult:
    settings = runtime(request).settings
    if not settings.signup_enabled:
        raise Forbidden("sign-up is closed on this server; ask an admin for an account")
    with tx(request) as session:
        user = users.create_user(
            session,
            body.name,
            body.password,
            email=body.email,
            signup_credit_micro=settings.signup_credit_micro,
        )
        secret, _ = tokens.create_token(session, user, "registration")
        return AuthResult(token=secret, user=UserPublic.model_validate(user))


@router.post("/auth/login")
def login(body: LoginRequest, request: Request) -> AuthResult:
    with tx(request) as session:
        user = users.authenticate(session, body.name, body.password)
        secret, _ = tokens.create_token(session, user, body.token_name)
        return AuthResult(token=secret, user=UserPublic.model_validate(user))


@router.get("/me")
def me(request: Request) -> UserPublic:
    with tx(request) as session:
        return UserPublic.model_validate(current_user(session, request))


@router.get("/tokens")
def list_tokens(request: Request) -> list[TokenPublic]:
    with tx(request) as session:
        user = current_user(session, request)
        return [TokenPublic.model_validate(t) for t in tokens.list_tokens(session, user)]


@router.post("/tokens", status_code=201)
def create_token(body: TokenCreate, request: Request) -> TokenCreated:
    with tx(request) as session:
        user = current_user(session, request)
        secret, row = tokens.create_token(session, user, body.name)
        return TokenCreated(token=secret, info=TokenPublic.model_validate(row))


@router.delete("/tokens/{token_id}", status_code=204)
def revoke_token(token_id: int, request: Request) -> Response:
    with tx(request) as session:
        user = current_user(session, request)
        tokens.revoke_token(session, user, token_id)
    return Response(status_code=204)
