"""The app's route order: every route is reached by its own path.

FastAPI takes the first route, in the order they were added, whose path and method match a
request; the app adds the runners' routes and /healthz first, since they carry most of its
requests. No route may hide another that way: a path made from each route's own template
(every parameter filled in) must resolve to that route and not to one added before it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from starlette.routing import BaseRoute, Match

from factories import make_settings
from gpulease.server.app import create_app

PARAM = re.compile(r"{([^}:]+)(?::([^}]+))?}")
FASTAPI_DOCS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
SAMPLE = {
    "int": "7",
    "float": "7.5",
    "path": "p1zq/x",
    "uuid": "0" * 8 + "-0000-0000-0000-" + "0" * 12,
}


def leaves(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """The routes in the order the app tries them, included routers opened in place."""
    for route in routes:
        inner = getattr(route, "effective_route_contexts", None)
        if inner is not None:
            yield from leaves(inner())
        else:
            yield route


def template(route: BaseRoute) -> str:
    route = getattr(route, "starlette_route", None) or route  # a WebSocket route, a mount
    found = getattr(route, "path_format", None) or getattr(route, "path", None)
    assert isinstance(found, str), route
    return found


def sample_path(path_format: str) -> str:
    return PARAM.sub(lambda m: SAMPLE.get(m.group(2) or "", "p1zq"), path_format) or "/"


def scope_for(route: BaseRoute, path: str) -> dict[str, Any]:
    websocket = "WebSocket" in type(route).__name__ or (
        "WebSocket" in type(getattr(route, "starlette_route", None)).__name__
    )
    methods = getattr(route, "methods", None) or {"GET"}
    return {
        "type": "websocket" if websocket else "http",
        "path": path,
        "root_path": "",
        "method": sorted(methods)[0],
        "headers": [],
        "query_string": b"",
    }


def resolve(routes: list[BaseRoute], scope: dict[str, Any]) -> BaseRoute | None:
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return route
    return None


def test_every_route_is_reached_by_its_own_path(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path / "home", f"sqlite:///{tmp_path}/db"))
    routes = list(leaves(app.router.routes))
    assert len(routes) > 100  # the whole app, included routers opened
    hidden = []
    for route in routes:
        if type(route).__name__ == "Mount":
            path = template(route).rstrip("/") + "/p1zq"
        else:
            path = sample_path(template(route))
        scope = scope_for(route, path)
        found = resolve(routes, scope)
        if found is not route:
            where = template(found) if found is not None else "nothing"
            hidden.append(f"{scope['method']} {path}: {template(route)} -> {where}")
    assert hidden == []


def test_the_runners_routes_and_the_health_probe_come_first(tmp_path: Path) -> None:
    """What the order is for: nothing of the renters' API or pages is tried before them
    (FastAPI's own documentation routes, added with the app, aside)."""
    app = create_app(make_settings(tmp_path / "home", f"sqlite:///{tmp_path}/db"))
    templates = [template(r) for r in leaves(app.router.routes)]
    first = [i for i, t in enumerate(templates) if t.startswith("/runner/") or t == "/healthz"]
    rest = [i for i, t in enumerate(templates) if i not in first and t not in FASTAPI_DOCS]
    assert len(first) > 20 and rest
    assert max(first) < min(rest)
