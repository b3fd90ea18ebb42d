"""What every route needs: the runtime, a transaction, the caller."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import Request
from sqlalchemy.orm import Session

from gpulease.core.errors import Forbidden, Unauthorized
from gpulease.server.db import transaction
from gpulease.server.orm import User
from gpulease.server.runtime import Runtime
from gpulease.server.services import tokens

SESSION_COOKIE = "gpulease_session"


def runtime(request: Request) -> Runtime:
    rt = request.app.state.runtime
    assert isinstance(rt, Runtime)
    return rt


@contextmanager
def tx(request: Request) -> Iterator[Session]:
    with transaction(runtime(request).sessions) as session:
        yield session


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


def current_user(session: Session, request: Request) -> User:
    secret = bearer(request) or request.cookies.get(SESSION_COOKIE)
    if not secret:
        raise Unauthorized(
            "no token: log in with `gpulease login --server URL` "
            "or send 'Authorization: Bearer TOKEN'"
        )
    return tokens.resolve_token(session, secret)


def current_admin(session: Session, request: Request) -> User:
    user = current_user(session, request)
    if user.role != "admin":
        raise Forbidden("this needs an admin account")
    return user
