"""The migrations build exactly the schema the ORM declares, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from gpulease.server.db import make_engine, migrate
from gpulease.server.orm import Base


def test_migrated_schema_matches_the_models(database_url: str) -> None:
    engine = make_engine(database_url)
    migrate(engine)  # idempotent: the Postgres database was migrated once per session
    with engine.connect() as conn:
        diff = compare_metadata(
            MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
        )
    engine.dispose()
    assert diff == [], "write a migration for: " + repr(diff)
