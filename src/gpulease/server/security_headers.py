"""Headers every response carries, whatever served it (API, console, static files)."""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# A year, the figure browsers' HSTS preload lists ask for; only ever sent over TLS, since a
# browser ignores it on plain HTTP and the header must never pin an address without TLS.
HSTS = "max-age=31536000"


class SecurityHeaders:
    """Adds `X-Content-Type-Options: nosniff` to every HTTP response (a browser must not run
    an uploaded or static file as a script it guessed) and `Strict-Transport-Security` when
    the request came over TLS (https, directly or as uvicorn's trusted proxy headers say).
    Headers a route set itself are kept."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        over_tls = scope.get("scheme") == "https"

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("X-Content-Type-Options", "nosniff")
                if over_tls:
                    headers.setdefault("Strict-Transport-Security", HSTS)
            await send(message)

        await self.app(scope, receive, send_with_headers)
