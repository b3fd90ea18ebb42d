"""create_app: the ASGI application, its error handling and its background reconcilers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import DataError

from gpulease.backends.base import Backend
from gpulease.core.errors import GpuleaseError
from gpulease.server.observability import prometheus
from gpulease.server.reconcilers.loop import ReconcilerThread
from gpulease.server.routers.api import (
    admin,
    auth,
    billing,
    catalog,
    instances,
    runner,
    runner_streams,
    runner_workspace,
    runs,
)
from gpulease.server.routers.api import datasets as datasets_api
from gpulease.server.routers.api import estimates as estimates_api
from gpulease.server.routers.api import metrics as metrics_api
from gpulease.server.routers.api import notification_settings as notification_settings_api
from gpulease.server.routers.api import plans as plans_api
from gpulease.server.routers.api import quotas as quotas_api
from gpulease.server.routers.api import statements as statements_api
from gpulease.server.routers.api import support as support_api
from gpulease.server.routers.api import sweeps as sweeps_api
from gpulease.server.routers.api import teams as teams_api
from gpulease.server.routers.api import templates as templates_api
from gpulease.server.routers.auth_limits import TokenGuessingGate
from gpulease.server.routers.ui import pages
from gpulease.server.routers.ui.jupyter_proxy import JupyterOriginGate
from gpulease.server.runtime import Runtime, build_runtime
from gpulease.server.security_headers import SecurityHeaders
from gpulease.server.settings import Settings
from gpulease.server.signals import Broadcast

log = logging.getLogger("gpulease.server")
STATIC = __file__.rsplit("/", 1)[0] + "/static"


@dataclass
class Signals:
    runs: Broadcast = field(default_factory=Broadcast)
    logs: Broadcast = field(default_factory=Broadcast)
    metrics: Broadcast = field(default_factory=Broadcast)  # a run's metric points
    gpu: Broadcast = field(default_factory=Broadcast)  # GPU samples


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path"))
        parts.append(f"{where or 'request'}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def create_app(
    settings: Settings | None = None,
    *,
    backend: Backend | None = None,
    reconcilers: bool = True,
    runtime: Runtime | None = None,
) -> FastAPI:
    """The server. Tests pass a FakeBackend and reconcilers=False to drive ticks themselves."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt = runtime or build_runtime(settings, backend)
        app.state.runtime = rt
        thread = ReconcilerThread(rt) if reconcilers else None
        app.state.wake_reconcilers = thread.wake.set if thread else (lambda: None)
        if thread:
            thread.start()
        try:
            yield
        finally:
            if thread:
                thread.stop()
                thread.join(timeout=10)
            if runtime is None:
                rt.engine.dispose()

    app = FastAPI(title="gpulease", version="0.1.0", lifespan=lifespan)
    app.state.signals = Signals()
    app.state.wake_reconcilers = lambda: None

    @app.exception_handler(GpuleaseError)
    async def _refusal(request: Request, exc: GpuleaseError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_message(exc)}, status_code=422)

    @app.exception_handler(DataError)
    async def _unstorable(request: Request, exc: DataError) -> JSONResponse:
        # PostgreSQL refuses NUL in text, wherever a request's string reaches a query.
        if "NUL" not in str(exc.orig):
            raise exc
        message = "invalid request: text cannot contain NUL (\\u0000) characters"
        return JSONResponse({"detail": message}, status_code=422)

    # FastAPI tries a request's path against the routes in the order they were added (about
    # 1.5 µs a route): the runners' calls (heartbeats, logs, metrics, commands), most of the
    # server's requests while anything runs, and the health probe come first. Their paths
    # (/runner/v1/..., /healthz) are matched by no other route, so the order changes nothing
    # else (tests/server/routers/test_route_order.py resolves every route's own path).
    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.include_router(runner.router)
    app.include_router(metrics_api.runner_router)
    app.include_router(datasets_api.runner_router)
    app.include_router(templates_api.runner_router)
    app.include_router(runner_workspace.router)  # workspace snapshots of a fleet's runners
    app.include_router(runner_streams.router)  # the runner's terminal and Jupyter streams
    # metrics first, so /runs/compare is not read as a run id
    app.include_router(metrics_api.router, prefix="/api/v1")
    for module in (auth, catalog, instances, runs, billing, admin):
        app.include_router(module.router, prefix="/api/v1")
    # estimates, statements, plans and caps, teams
    for module in (estimates_api, statements_api, plans_api, teams_api, quotas_api):
        app.include_router(module.router, prefix="/api/v1")
    app.include_router(datasets_api.router, prefix="/api/v1")
    for module in (notification_settings_api, support_api, sweeps_api):
        app.include_router(module.router, prefix="/api/v1")
    app.include_router(templates_api.router, prefix="/api/v1")
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    prometheus.install(app)  # GET /metrics and the request latency middleware
    app.add_middleware(TokenGuessingGate)  # 429 for an address that keeps sending bad tokens
    app.add_middleware(JupyterOriginGate)  # a Jupyter host serves JupyterLab and nothing else
    app.add_middleware(SecurityHeaders)  # nosniff everywhere, HSTS over TLS

    return app
