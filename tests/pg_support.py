"""Databases of their own on a PostgreSQL server, for the test session and the benchmarks:
made with a random name beside the admin database, and dropped with any connection still
open to them ended first."""

from __future__ import annotations

import uuid

from sqlalchemy import create_engine, text


def create_database(admin_url: str, prefix: str) -> tuple[str, str]:
    """A new, empty database on admin_url's server: (its URL, its name)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return admin_url.rsplit("/", 1)[0] + "/" + name, name


def drop_database(admin_url: str, name: str) -> None:
    """create_database's database dropped, its open connections ended first."""
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :n AND pid <> pg_backend_pid()"
                ),
                {"n": name},
            )
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    finally:
        admin.dispose()
