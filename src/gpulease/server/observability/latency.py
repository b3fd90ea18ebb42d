"""An ASGI middleware timing every HTTP request into a histogram by method and route template."""

from __future__ import annotations

import re
import time

from prometheus_client import Histogram
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "unmatched"


def route_template(scope: Scope, root_path: str = "") -> str:
    """The route's path template ('/api/v1/instances/{ref}'), never the concrete path: a
    label per instance name would grow without bound. Unrouted requests share one label.

    FastAPI keeps a router's routes unprefixed ('/instances/{ref}' under '/api/v1'), so
    the prefix is recovered as the part of the request path before the route's own match.
    root_path is the scope's root_path when the request came in.
    """
    route = scope.get("route")
    template = getattr(route, "path", None)
    if route is None:  # a mount (static files) moves its prefix into root_path instead
        mounted = str(scope.get("root_path", ""))
        return mounted[len(root_path) :] + "/{path}" if len(mounted) > len(root_path) else UNMATCHED
    if not isinstance(template, str) or not template:
        return UNMATCHED
    if isinstance(route, Mount):
        template = template.rstrip("/") + "/{path}"
    regex = getattr(route, "path_regex", None)
    path = scope.get("path", "")
    if isinstance(regex, re.Pattern) and isinstance(path, str) and not regex.match(path):
        for i, char in enumerate(path):
            if i and char == "/" and regex.match(path[i:]):
                return path[:i] + template
    return template


class LatencyMiddleware:
    """Observes the seconds from a request's arrival until its response starts (the status
    line and headers), or until the exception that ended it. Time to the response start,
    not to the last byte, so that a live stream (SSE) held open for an hour counts as the
    fast answer it was. The router fills scope["route"] on the way in."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        root_path = str(scope.get("root_path", ""))
        observed = False

        def observe() -> None:
            nonlocal observed
            if not observed:
                observed = True
                self.histogram.labels(scope["method"], route_template(scope, root_path)).observe(
                    time.perf_counter() - started
                )

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                observe()
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            observe()
