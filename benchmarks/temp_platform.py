"""The benchmarks' server: a Platform (tests/processes.py) on SQLite in a temporary home."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

TESTS = str(Path(__file__).resolve().parents[1] / "tests")
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from pg_support import create_database, drop_database  # noqa: E402
from processes import Platform, free_port  # noqa: E402


def sqlite_platform(
    root: Path,
    simulated: str,
    extra_env: Mapping[str, str] | None = None,
    kind: type[Platform] = Platform,
) -> Platform:
    """A Platform (of that kind), not yet started, whose home, database, server log and CLI
    config are under root, on a free loopback port, offering the simulated GPUs
    ("T4:1,A100-80GB:1")."""
    return kind(
        home=root / "home",
        database_url=f"sqlite:///{root / 'home' / 'gpulease.db'}",
        port=free_port(),
        simulated=simulated,
        log_path=root / "server.log",
        config=root / "cli.json",
        extra_env=dict(extra_env or {}),
    )


def byte_compile() -> None:
    """gpulease's modules compiled to bytecode beside their sources, as pip does when it
    installs the package: a checkout used with PYTHONDONTWRITEBYTECODE set (or never imported
    before) would compile them again in every process the benchmark starts, and a renter's
    installed CLI does not."""
    import compileall

    import gpulease

    package = Path(gpulease.__file__).parent
    if not compileall.compile_dir(package, quiet=1):
        raise RuntimeError(f"compiling {package} failed")


def pg_database(admin_url: str, *, probe: bool = False) -> tuple[str, str] | None:
    """A new database (url, name) on the PostgreSQL server of admin_url, or None when none
    answers; probe: only ask whether one answers."""
    from sqlalchemy import create_engine, text

    from gpulease.server.db import normalize_url

    admin_url = normalize_url(admin_url)
    try:
        if probe:
            admin = create_engine(admin_url)
            with admin.connect() as conn:
                conn.execute(text("SELECT 1"))
            admin.dispose()
            return admin_url, ""
        return create_database(admin_url, "gpulease_bench")
    except Exception:
        return None


def drop_pg(admin_url: str, name: str) -> None:
    """pg_database's database dropped, with any connection still open to it ended first."""
    from gpulease.server.db import normalize_url

    drop_database(normalize_url(admin_url), name)
