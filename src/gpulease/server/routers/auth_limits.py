"""Guessing limits at the door: the routes' helpers for logins and registrations, and the
middleware that answers 429 (with Retry-After), before any route runs, to a bearer request
from an address, or with a token beginning like one, that carried too many unknown, revoked
or expired bearer tokens lately."""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpulease.core.errors import Unauthorized
from gpulease.server.orm import User
from gpulease.server.routers.deps import runtime, tx
from gpulease.server.services import users
from gpulease.server.services.ratelimit import AuthGuard, TooManyAttempts, guard_of


def client_address(request: Request) -> str:
    """The peer's address (behind a reverse proxy: the proxy's, unless uvicorn trusts its
    X-Forwarded-For, as it does from 127.0.0.1)."""
    return request.client.host if request.client else "unknown"


def auth_guard(request: Request) -> AuthGuard:
    rt = runtime(request)
    return guard_of(request.app.state, rt.settings, rt.sessions)


def within_limits(check: Callable[..., None], *args: str) -> None:
    """Run a guard's check for an API route; its 429 goes out with Retry-After."""
    try:
        check(*args)
    except TooManyAttempts as exc:
        raise exc.http() from None


def guarded_login(request: Request, name: str, password: str) -> User:
    """users.authenticate, in a short transaction of its own, behind the per-account and
    per-address limits: TooManyAttempts while either is exhausted (even for the right
    password), and each failure counted. Call it outside any transaction of the request
    (the guard's transactions would wait on it, on SQLite forever); the user comes back
    detached, for the caller's next transaction."""
    guard, address = auth_guard(request), client_address(request)
    guard.check_login(name, address)
    try:
        with tx(request) as session:
            return users.authenticate(session, name, password)
    except Unauthorized:
        guard.login_failed(name, address, "wrong name or password")
        raise


def _bearer(scope: Scope) -> str | None:
    """The secret of the request's `Authorization: Bearer` header, as routers.deps reads it."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            if value[:7].lower() != b"bearer ":
                return None
            return value[7:].decode("latin-1").strip() or None
    return None


def _runner_route(scope: Scope) -> bool:
    # Runner tokens are not counted: every runner of a node calls from the node's address,
    # and one whose instance was released keeps calling with a token that is now unknown.
    return str(scope.get("path", "")).startswith("/runner/")


class TokenGuessingGate:
    """Counts 401 answers to bearer requests per client address and per the token they
    began like; the database work runs in the thread pool, off the event loop."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        secret = _bearer(scope) if scope["type"] == "http" else None
        guard = _guard(scope)
        if secret is None or _runner_route(scope) or guard is None:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = str(client[0]) if client else "unknown"
        try:
            if not guard.known_clear(address, secret):
                await run_in_threadpool(guard.check_token, address, secret)
        except TooManyAttempts as refusal:
            await _answer(send, refusal)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                await run_in_threadpool(guard.token_failed, address, secret)
            await send(message)

        await self.app(scope, receive, counting_send)


def _guard(scope: Scope) -> AuthGuard | None:
    app = scope.get("app")
    runtime = getattr(getattr(app, "state", None), "runtime", None)
    if app is None or runtime is None:
        return None
    return guard_of(app.state, runtime.settings, runtime.sessions)


async def _answer(send: Send, refusal: TooManyAttempts) -> None:
    body = json.dumps({"detail": refusal.message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(refusal.retry_after_s).encode()),
    ]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
