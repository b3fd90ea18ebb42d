"""Engines and transactions (server/db.py) on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import text

from gpulease.server.db import make_engine, make_sessionmaker, transaction, unsynced


def test_an_unsynced_transaction_leaves_its_connection_synced_again(database_url: str) -> None:
    """Metric points commit without waiting for the disk; the pooled connection that did it
    is back to waiting before any other transaction (a ledger entry) uses it."""
    engine = make_engine(database_url)
    setting = "PRAGMA synchronous" if engine.dialect.name == "sqlite" else "SHOW synchronous_commit"
    relaxed, normal = ("1", "2") if engine.dialect.name == "sqlite" else ("off", "on")
    try:
        for _ in range(2):
            with transaction(make_sessionmaker(unsynced(engine))) as session:
                assert str(session.execute(text(setting)).scalar()) == relaxed
            with transaction(make_sessionmaker(engine)) as session:
                assert str(session.execute(text(setting)).scalar()) == normal
        assert engine.pool.checkedin() == 1  # one connection did all four
    finally:
        engine.dispose()
