"""What a running server holds: settings, database, catalog, backend. Built once at start."""

from __future__ import annotations

import logging
import platform
from dataclasses import dataclass, replace
from functools import cached_property

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from gpulease.backends.base import Backend
from gpulease.core.catalog import Catalog, default_pricing_text, load_catalog
from gpulease.core.errors import InvalidInput
from gpulease.gpus.discovery import Nvml, discover
from gpulease.server.db import make_engine, make_sessionmaker, migrate, transaction, unsynced
from gpulease.server.isolation import require_sandbox
from gpulease.server.services import nodes, users
from gpulease.server.services.datasets.vault import Vault, open_vault
from gpulease.server.settings import Settings
from gpulease.server.tls import prepare_tls

log = logging.getLogger("gpulease.server")


@dataclass
class Runtime:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    catalog: Catalog
    backend: Backend
    node_name: str
    admin_password_generated: str | None = None
    # Dataset storage: blob store and master key (services/datasets).
    vault: Vault | None = None

    @cached_property
    def unsynced_sessions(self) -> sessionmaker[Session]:
        """Sessions whose commits do not wait for the disk (db.unsynced): metric points."""
        return make_sessionmaker(unsynced(self.engine))


def default_backend(settings: Settings) -> Backend:
    """The backend settings.backend names; Ray is imported only when it is the one."""
    if settings.backend == "ray":
        if not settings.ray_address:
            raise InvalidInput(
                "GPULEASE_BACKEND=ray needs the cluster's address: set GPULEASE_RAY_ADDRESS "
                "or pass --ray-address HOST:PORT (the head's GCS port)"
            )
        from gpulease.backends.ray import RayBackend

        return RayBackend(
            settings.ray_address,
            settings.ray_node_home,
            namespace=settings.ray_namespace,
            shared_env_cache=settings.env_cache,
        )
    from gpulease.backends.local import LocalBackend

    return LocalBackend()


def build_runtime(
    settings: Settings, backend: Backend | None = None, nvml: Nvml | None = None
) -> Runtime:
    """Prepare the data directory, migrate the database, load prices, register this host.
    Without a backend given, runners start on this host: their jobs need the sandbox.
    nvml is discovery's seam (tests give a fake driver); by default the real pynvml."""
    if backend is None:
        require_sandbox(settings)
    settings.home.mkdir(parents=True, exist_ok=True)
    settings.home.chmod(0o700)
    prepare_tls(settings)
    for path in (settings.workspaces_path, settings.runners_path, settings.uploads_path):
        path.mkdir(parents=True, exist_ok=True)
    if settings.pricing_file is None and not settings.pricing_path.exists():
        settings.pricing_path.write_text(default_pricing_text())
    catalog = load_catalog(settings.pricing_path)
    if settings.currency_symbol or settings.currency_name:
        catalog = replace(
            catalog,
            currency_symbol=settings.currency_symbol or catalog.currency_symbol,
            currency_name=settings.currency_name or catalog.currency_name,
        )
    engine = make_engine(settings.db_url)
    migrate(engine)
    sessions = make_sessionmaker(engine)
    vault = open_vault(settings, sessions)
    node_name = settings.node_name or platform.node() or "local"
    backend = backend or default_backend(settings)
    # a fleet backend's nodes come from its cluster (server/reconcilers/fleet.py)
    local = settings.backend == "local"
    inventory = discover(catalog, settings.simulated_gpus, nvml=nvml) if local else None
    with transaction(sessions) as session:
        if inventory is not None:
            nodes.register_node(session, node_name, "local", inventory)
        password = settings.admin_password.get_secret_value() if settings.admin_password else None
        generated = users.ensure_admin(session, settings.admin_name, password)
    return Runtime(
        settings=settings,
        engine=engine,
        sessions=sessions,
        catalog=catalog,
        backend=backend,
        node_name=node_name,
        admin_password_generated=generated,
        vault=vault,
    )
