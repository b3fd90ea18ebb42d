"""The migrations build exactly the schema the ORM declares, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from gpulease.server.db import alembic_config, at_head, head_revision, make_engine, migrate
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


def test_a_database_one_revision_behind_is_brought_to_head(tmp_path: Path) -> None:
    """migrate() skips Alembic only for a database at the newest revision."""
    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    with engine.connect() as conn:
        cfg = alembic_config(engine)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
        command.downgrade(cfg, "-1")
        conn.commit()
        assert not at_head(conn)
    migrate(engine)
    with engine.connect() as conn:
        assert at_head(conn)
        assert MigrationContext.configure(conn).get_current_revision() == head_revision()
    engine.dispose()
