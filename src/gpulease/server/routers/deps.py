"""What every route needs: the runtime, a transaction, the caller."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Path, Query, Request
from sqlalchemy.orm import Session
from starlette.requests import HTTPConnection

from gpulease.core.errors import Forbidden, InvalidInput, Unauthorized
from gpulease.core.ids import MAX_ID
from gpulease.core.money import MoneyError, parse_credits
from gpulease.server.db import readers, transaction
from gpulease.server.orm import Instance, User
from gpulease.server.runtime import Runtime
from gpulease.server.services import runners, tokens

SESSION_COOKIE = "gpulease_session"


def runtime(request: Request) -> Runtime:
    rt = request.app.state.runtime
    assert isinstance(rt, Runtime)
    return rt


@contextmanager
def tx(request: Request) -> Iterator[Session]:
    with transaction(runtime(request).sessions) as session:
        yield session


@contextmanager
def read_tx(request: Request) -> Iterator[Session]:
    """A transaction that only reads (db.readers): on SQLite it takes no write lock, so it
    neither waits for a writer nor holds one up; on PostgreSQL it sends no BEGIN or COMMIT."""
    with transaction(readers(runtime(request).sessions)) as session:
        yield session


def bearer(connection: HTTPConnection) -> str | None:
    """The token of an `Authorization: Bearer` header (HTTP request or WebSocket), if any."""
    header = connection.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


def runner_token(request: Request) -> str:
    """The per-instance token of a runner call (docs/runner-protocol.md); 401 without one."""
    token = bearer(request)
    if not token:
        raise Unauthorized("runner calls need 'Authorization: Bearer <runner token>'")
    return token


SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


def same_origin(connection: HTTPConnection, *, require_header: bool = False) -> bool:
    """The one origin check (CSRF) for HTTP requests and WebSockets alike: False when the
    Origin (or, lacking it, the Referer) names another host than this one. `Origin: null`
    (sandboxed frames, some redirects) counts as another host.

    With neither header the answer is `not require_header`: every browser sends Origin on a
    POST and on a WebSocket handshake, so a cookie-authenticated state change without one is
    refused by `require_same_origin`; a caller with a bearer token is not a browser and is
    not asked.
    """
    source = connection.headers.get("origin") or connection.headers.get("referer")
    if source is None:
        return not require_header
    netloc = urlsplit(source).netloc.lower()
    return bool(netloc) and netloc == connection.headers.get("host", "").lower()


def require_same_origin(connection: HTTPConnection) -> None:
    """403 unless the Origin or Referer names this server (one of them must be present)."""
    if connection.headers.get("origin") is None and connection.headers.get("referer") is None:
        raise Forbidden(
            "this request carries the console's cookie but neither an Origin nor a Referer "
            "header; send it from the console, or use 'Authorization: Bearer TOKEN'"
        )
    if not same_origin(connection, require_header=True):
        raise Forbidden("this request was sent from another site; use the console itself")


def current_user(session: Session, request: Request) -> User:
    """The caller, by bearer token or by the console's session cookie. A cookie alone does
    not authorise a state change from another site (CSRF)."""
    secret = bearer(request)
    if secret is None:
        secret = request.cookies.get(SESSION_COOKIE)
        if secret and request.method not in SAFE_METHODS:
            require_same_origin(request)
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


def credits(text: str | None, what: str) -> int | None:
    """A user-typed amount in micro-credits; None stays None (no cap)."""
    if text is None or not text.strip():
        return None
    try:
        value = parse_credits(text)
    except MoneyError as exc:
        raise InvalidInput(f"{what}: {exc}") from exc
    if value < 0:
        raise InvalidInput(f"{what} cannot be negative")
    return value


def _session(request: Request) -> Iterator[Session]:
    with tx(request) as session:
        yield session


def _detached_user(request: Request) -> User:
    with tx(request) as session:
        return current_user(session, request)


def _detached_runner_instance(request: Request, token: RunnerToken) -> Instance:
    with tx(request) as session:
        return runners.instance_for_token(session, token)


def _runner_instance(session: SessionDep, token: RunnerToken) -> Instance:
    return runners.instance_for_token(session, token)


def _user(session: SessionDep, request: Request) -> User:
    return current_user(session, request)


def _admin(session: SessionDep, request: Request) -> User:
    return current_admin(session, request)


# One transaction per request: it commits when the route returns, before the response is
# sent (scope="function"), and rolls back when the route raises.
SessionDep = Annotated[Session, Depends(_session, scope="function")]
CurrentUser = Annotated[User, Depends(_user, scope="function")]
AdminUser = Annotated[User, Depends(_admin, scope="function")]
# The caller, authenticated in a short transaction of its own that has already ended: for
# routes whose services open their own transactions around blob or network I/O.
DetachedUser = Annotated[User, Depends(_detached_user)]
RunnerToken = Annotated[str, Depends(runner_token)]
# The instance whose runner token authorises the call, in the request's transaction.
RunnerInstance = Annotated[Instance, Depends(_runner_instance, scope="function")]
DetachedRunnerInstance = Annotated[Instance, Depends(_detached_runner_instance)]

# Every integer id in a path or query: a value an id column holds (core.ids.MAX_ID), so that a
# huge one is a 422 rather than an overflow inside the database driver.
IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
IdQuery = Annotated[int, Query(ge=1, le=MAX_ID)]
