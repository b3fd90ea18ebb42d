"""Shared fixtures: every database test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from gpulease.server.db import make_engine, migrate
from gpulease.server.orm import Base
from ray_support import ray_cluster  # noqa: F401  (one Ray cluster per session)

PG_ADMIN_URL = os.environ.get("GPULEASE_TEST_PG", "postgresql+psycopg://root@127.0.0.1:5432/test")


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Caches (the dataset push index) go under the test's own directory, never ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def _pg_available() -> bool:
    try:
        engine = create_engine(PG_ADMIN_URL)
        with engine.connect():
            pass
        engine.dispose()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, migrated, dropped at the end."""
    if not _pg_available():
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN_URL}; CI must start it")
        pytest.skip(f"PostgreSQL is not reachable at {PG_ADMIN_URL}")
    name = f"gpulease_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    engine = make_engine(url)
    migrate(engine)
    engine.dispose()
    yield url
    with admin.connect() as conn:
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :n AND pid <> pg_backend_pid()"
            ),
            {"n": name},
        )
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


def _truncate_pg(url: str) -> None:
    engine = create_engine(url)
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    engine.dispose()


@pytest.fixture(scope="session")
def sqlite_migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite database migrated to head, copied for each test: migrating a new file
    costs about 0.1 s, copying one about a millisecond (the server's own migrate() then
    finds it at head, as after any restart)."""
    path = tmp_path_factory.mktemp("sqlite-migrated") / "gpulease.db"
    engine = make_engine(f"sqlite:///{path}")
    migrate(engine)
    engine.dispose()  # closing the last connection checkpoints the WAL into the file
    return path


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        shutil.copyfile(request.getfixturevalue("sqlite_migrated"), tmp_path / "gpulease.db")
        yield f"sqlite:///{tmp_path / 'gpulease.db'}"
        return
    url = request.getfixturevalue("pg_database")
    _truncate_pg(url)
    yield url
