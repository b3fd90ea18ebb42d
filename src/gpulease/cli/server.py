"""`gpulease server`: validate the settings, prepare the runtime, print a banner, serve."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape

from gpulease import __version__
from gpulease.cli.output import console, fail
from gpulease.core.errors import GpuleaseError

if TYPE_CHECKING:
    from gpulease.server.runtime import Runtime
    from gpulease.server.settings import Settings

# The server's own modules (SQLAlchemy, FastAPI, the reconcilers, uvicorn) load inside the
# commands that need them: every other CLI command starts without them
# (tests/cli/test_cli_imports.py holds this).

GRACEFUL_SHUTDOWN_S = 5


def settings_error_text(exc: ValidationError) -> str:
    """Pydantic's errors in the words of the environment variables people set."""
    parts = []
    for error in exc.errors():
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        loc = [str(p) for p in error.get("loc", ())]
        parts.append(f"GPULEASE_{loc[0].upper()}: {message}" if loc else message)
    return "invalid settings: " + "; ".join(parts)


def database_text(settings: Settings) -> str:
    from sqlalchemy.engine import make_url

    from gpulease.server.db import normalize_url

    url = make_url(normalize_url(settings.db_url))
    if url.get_backend_name() == "sqlite":
        return f"SQLite {url.database}"
    return f"PostgreSQL {url.render_as_string(hide_password=True)}"


def node_gpus_text(rt: Runtime) -> str:
    from sqlalchemy import select

    from gpulease.server.db import transaction
    from gpulease.server.orm import Node

    with transaction(rt.sessions) as session:
        node = session.scalar(select(Node).where(Node.name == rt.node_name))
        gpus = [g for g in node.gpus if g.present] if node is not None else []
        counts = Counter(g.model or g.nvml_name for g in gpus)
        simulated = sum(1 for g in gpus if g.simulated)
    if not counts:
        return f"{rt.node_name}: no GPUs (CPU-only instances)"
    text = ", ".join(f"{n}× {model}" for model, n in sorted(counts.items()))
    if simulated:
        text += " (simulated)" if simulated == len(gpus) else f" ({simulated} simulated)"
    return f"{rt.node_name}: {text}"


def server(
    host: Annotated[str | None, typer.Option("--host", help="default: GPULEASE_HOST")] = None,
    port: Annotated[int | None, typer.Option("--port", help="default: GPULEASE_PORT")] = None,
    backend: Annotated[
        str | None, typer.Option("--backend", help="local or ray; default: GPULEASE_BACKEND")
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address", help="the Ray head's HOST:PORT; default: GPULEASE_RAY_ADDRESS"
        ),
    ] = None,
) -> None:
    """Run the gpulease server here (settings from GPULEASE_* environment variables)."""
    from sqlalchemy.exc import SQLAlchemyError

    from gpulease.backends.local import LocalBackend
    from gpulease.server.app import create_app
    from gpulease.server.isolation import UNSANDBOXED_WARNING
    from gpulease.server.runner_socket import serve
    from gpulease.server.runtime import build_runtime
    from gpulease.server.settings import Settings
    from gpulease.server.tls import prepare_tls

    overrides: dict[str, Any] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    if backend is not None:
        overrides["backend"] = backend
    if ray_address is not None:
        overrides["ray_address"] = ray_address
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        fail(settings_error_text(exc), 2)
    try:
        rt = build_runtime(settings)
    except GpuleaseError as exc:
        fail(exc.message, 2)
    except SQLAlchemyError as exc:
        fail(f"cannot open the database ({database_text(settings)}): {exc.__cause__ or exc}")
    except OSError as exc:
        fail(f"cannot prepare the data directory {settings.home}: {exc}")
    if isinstance(rt.backend, LocalBackend):
        rt.backend.prestart(
            settings.runners_path
        )  # the first instance's runner is ready before it is asked for
    tls = prepare_tls(settings)  # made (when asked for) and checked by build_runtime
    out = console()
    out.print(f"[bold]gpulease server {__version__}[/bold]")
    scheme = "https" if tls else "http"
    for key, value in (
        ("url", f"{scheme}://{settings.host}:{settings.port}"),
        ("data", str(settings.home)),
        ("database", database_text(settings)),
        ("node", node_gpus_text(rt))
        if settings.backend == "local"
        else ("backend", f"Ray cluster at {settings.ray_address}"),
    ):
        out.print(f"  {key:<9} {escape(value)}", soft_wrap=True)
    if tls is not None:
        kind = "self-signed" if tls.self_signed else "operator's"
        out.print(f"  {'tls':<9} {kind} certificate {escape(str(tls.cert))}", soft_wrap=True)
        out.print(f"  {'sha-256':<9} {tls.fingerprint}", soft_wrap=True)
    if settings.unsandboxed_single_user:
        out.print(f"[bold red]{escape(UNSANDBOXED_WARNING)}[/bold red]", soft_wrap=True)
    if rt.admin_password_generated:
        out.print(
            f"[bold yellow]first start:[/bold yellow] admin account "
            f"[bold]{escape(settings.admin_name)}[/bold], password "
            f"[bold]{escape(rt.admin_password_generated)}[/bold] (shown only this once)",
            soft_wrap=True,
        )
    app = create_app(settings, runtime=rt)
    https: dict[str, Any] = (
        {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)} if tls else {}
    )
    # uvicorn on settings.host:port and on the runners' Unix socket (server/runner_socket.py)
    try:
        serve(
            app,
            settings,
            **https,
            log_level="warning",
            access_log=False,
            # Followers of live logs hold their stream open for as long as the run lasts; on
            # shutdown, cut them after a moment (the SDK reconnects) rather than wait for the
            # runs.
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    finally:
        if isinstance(rt.backend, LocalBackend):
            rt.backend.stop_warm()  # the waiting runner exits with the server, not after it
