"""Engines and transactions (server/db.py) on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from gpulease.server import db
from gpulease.server.db import (
    PG_UNSYNCED_SELECT,
    make_engine,
    make_sessionmaker,
    read_only,
    statements,
    transaction,
    unsynced,
)


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


def test_a_connection_dropped_while_idle_is_replaced_and_a_warm_one_is_not_pinged(
    pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: a pooled connection that sat idle longer than PING_IF_IDLE_S is pinged at
    checkout and replaced when its server end is gone, so the transaction does not fail; one
    back in use sooner is not pinged (no round trip on the hot path): when its server end
    was dropped meanwhile, that one transaction fails and the pool then starts afresh."""
    engine = make_engine(pg_database)
    admin = create_engine(pg_database, isolation_level="AUTOCOMMIT")
    sessions = make_sessionmaker(engine)

    def backend() -> int:
        with transaction(sessions) as session:
            return int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())

    def drop(pid: int) -> None:
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid})

    try:
        first = backend()
        assert backend() == first  # the warm connection again
        drop(first)
        monkeypatch.setattr(db, "PING_IF_IDLE_S", 0.0)  # every connection counts as idle
        second = backend()
        assert second != first
        with transaction(make_sessionmaker(read_only(engine))) as session:  # pinged, autocommit
            assert session.execute(text("SELECT pg_backend_pid()")).scalar() == second
        monkeypatch.setattr(db, "PING_IF_IDLE_S", 3600.0)  # none does
        drop(second)
        with pytest.raises(OperationalError):
            backend()
        assert backend() not in (first, second)
    finally:
        engine.dispose()
        admin.dispose()


def test_a_read_only_transaction_takes_no_write_lock_and_no_round_trips(
    database_url: str,
) -> None:
    """db.read_only: on SQLite a deferred BEGIN, which reads while another connection holds
    the write lock (BEGIN IMMEDIATE would wait for it); on PostgreSQL autocommit, each
    statement its own transaction (no BEGIN or COMMIT to send)."""
    engine = make_engine(database_url)
    readers = make_sessionmaker(read_only(engine))
    try:
        if engine.dialect.name == "sqlite":
            with engine.connect() as writer:
                writer.execute(text("UPDATE users SET name = name"))  # holds the write lock
                with transaction(readers) as session:
                    assert session.execute(text("SELECT count(*) FROM users")).scalar() == 0
                writer.rollback()
        else:
            with transaction(readers) as session:
                first, second = (
                    session.execute(text("SELECT txid_current()")).scalar() for _ in range(2)
                )
            assert first != second
            with transaction(make_sessionmaker(engine)) as session:
                first, second = (
                    session.execute(text("SELECT txid_current()")).scalar() for _ in range(2)
                )
            assert first == second
    finally:
        engine.dispose()


def test_a_statement_of_its_own_commits_unsynced_and_leaves_its_connection_synced(
    pg_database: str,
) -> None:
    """db.statements with PG_UNSYNCED_SELECT in a CTE: the statement runs with
    synchronous_commit off (its own commit), the next one on the same connection with it on,
    and no SET LOCAL of unsynced() is sent outside a transaction."""
    engine = make_engine(pg_database)
    try:
        with statements(unsynced(engine)).connect() as conn:
            during = conn.execute(
                text(
                    f"WITH u AS ({PG_UNSYNCED_SELECT}) "
                    "SELECT current_setting('synchronous_commit') FROM u"
                )
            ).scalar()
            after = conn.execute(text("SHOW synchronous_commit")).scalar()
        assert (during, after) == ("off", "on")
    finally:
        engine.dispose()


def test_a_driver_write_transaction_commits_rolls_back_and_leaves_its_connection_synced(
    tmp_path: Path,
) -> None:
    """sqlite_write: the metric batch's transaction without an ORM session. It holds the
    write lock from its start, commits what it wrote, keeps nothing of a transaction that
    raised, and an unsynced() one leaves its pooled connection synced for the next user."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (n INTEGER)"))
        with db.sqlite_write(unsynced(engine)) as raw:
            raw.execute("INSERT INTO t VALUES (1)")
            assert raw.execute("PRAGMA synchronous").fetchone() == (1,)
            other = sqlite3.connect(tmp_path / "db.sqlite", timeout=0)
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")  # the lock is held from BEGIN on
            other.close()
        with pytest.raises(RuntimeError), db.sqlite_write(engine) as raw:
            raw.execute("INSERT INTO t VALUES (2)")
            raise RuntimeError("the batch failed half way")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT n FROM t")).scalars().all() == [1]
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 2
        assert engine.pool.checkedin() == 1  # one connection did it all
    finally:
        engine.dispose()


def test_a_driver_write_transaction_is_for_sqlite_only(pg_database: str) -> None:
    engine = make_engine(pg_database)
    try:
        with pytest.raises(ValueError, match="SQLite"), db.sqlite_write(engine):
            pass
    finally:
        engine.dispose()
