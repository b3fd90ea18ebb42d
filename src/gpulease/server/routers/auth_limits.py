"""Guessing limits at the door: the routes' helpers for logins and registrations, and the
middleware that answers 429 (with Retry-After), before any route runs, to an address whose
requests carried too many unknown, revoked or expired bearer tokens lately."""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import Request
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpulease.core.errors import Unauthorized
from gpulease.server.orm import User
from gpulease.server.routers.deps import runtime
from gpulease.server.services import users
from gpulease.server.services.ratelimit import AuthGuard, TooManyAttempts, guard_of


def client_address(request: Request) -> str:
    """The peer's address (behind a reverse proxy: the proxy's, unless uvicorn trusts its
    X-Forwarded-For, as it does from 127.0.0.1)."""
    return request.client.host if request.client else "unknown"


def auth_guard(request: Request) -> AuthGuard:
    return guard_of(request.app.state, runtime(request).settings)


def within_limits(check: Callable[..., None], *args: str) -> None:
    """Run a guard's check for an API route; its 429 goes out with Retry-After."""
    try:
        check(*args)
    except TooManyAttempts as exc:
        raise exc.http() from None


def guarded_login(request: Request, session: Session, name: str, password: str) -> User:
    """users.authenticate behind the per-account and per-address limits: TooManyAttempts
    while either is exhausted (even for the right password), and each failure counted."""
    guard, address = auth_guard(request), client_address(request)
    guard.check_login(name, address)
    try:
        return users.authenticate(session, name, password)
    except Unauthorized:
        guard.login_failed(name, address, "wrong name or password")
        raise


def _has_bearer(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return bool(value[:7].lower() == b"bearer ")
    return False


def _runner_route(scope: Scope) -> bool:
    # Runners are counted by the runner-token check of their own routes, not here.
    return str(scope.get("path", "")).startswith("/runner/")


class TokenGuessingGate:
    """Counts 401 answers to bearer requests per client address."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_bearer(scope) or _runner_route(scope):
            await self.app(scope, receive, send)
            return
        guard = _guard(scope)
        if guard is None:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = str(client[0]) if client else "unknown"
        try:
            guard.check_token(address)
        except TooManyAttempts as refusal:
            await _answer(send, refusal)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                guard.token_failed(address)
            await send(message)

        await self.app(scope, receive, counting_send)


def _guard(scope: Scope) -> AuthGuard | None:
    app = scope.get("app")
    runtime = getattr(getattr(app, "state", None), "runtime", None)
    if app is None or runtime is None:
        return None
    return guard_of(app.state, runtime.settings)


async def _answer(send: Send, refusal: TooManyAttempts) -> None:
    body = json.dumps({"detail": refusal.message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(refusal.retry_after_s).encode()),
    ]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
