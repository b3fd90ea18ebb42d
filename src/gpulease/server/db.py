"""Engine, sessions and migrations: the same code on SQLite (embedded) and PostgreSQL."""

from __future__ import annotations

import functools
import sqlite3
import struct
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from psycopg import AsyncConnection, pq
from psycopg.adapt import AdaptersMap, Dumper, PyFormat
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Connection, Engine, Select, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).parent / "migrations"

IN_BATCH = 500
"""Values per `IN (...)` list: PostgreSQL takes at most 65,535 bound parameters a statement,
so a list that grows with the data (every instance due, every chunk of a version) is asked
in slices of this many."""

_T = TypeVar("_T")


def utcnow() -> datetime:
    return datetime.now(UTC)


def normalize_url(url: str) -> str:
    """postgres:// and postgresql:// mean psycopg 3 here, the driver gpulease ships with."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str) -> Engine:
    url = normalize_url(url)
    if url.startswith("sqlite"):
        path = make_url(url).database
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=10
        )

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
            # Our own BEGIN IMMEDIATE (below): writers queue on the lock instead of failing
            # with "database is locked" when a read transaction later wants to write; only
            # a read_only() transaction begins deferred, without the lock.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            if conn.get_execution_options().get(UNSYNCED):  # set outside a transaction only
                _sqlite_unsynced(conn.connection.driver_connection, conn.connection.info)
            deferred = conn.get_execution_options().get(READ_ONLY)
            conn.exec_driver_sql("BEGIN" if deferred else "BEGIN IMMEDIATE")

        @event.listens_for(engine, "checkin")
        def _sqlite_checkin(dbapi_conn: Any, record: Any) -> None:
            if record.info.pop(UNSYNCED, False):
                dbapi_conn.execute("PRAGMA synchronous=FULL")

        return engine
    # The most recently returned connection goes out first (LIFO), so that a busy server
    # keeps reusing warm connections and only one that sat idle is pinged (see below).
    engine = create_engine(url, pool_size=10, max_overflow=20, pool_use_lifo=True)

    @event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_conn: Any, record: Any) -> None:
        record.info[IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        # A connection back in use within PING_IF_IDLE_S goes out without the round trip a
        # ping costs (pool_pre_ping pinged every checkout: one of a request's few round
        # trips). One idle for longer is pinged, and a dead one replaced: the pool tries
        # another connection on DisconnectionError. A database restarted within that
        # window fails the request that meets a dropped connection, and the pool then
        # drops every connection older than that error.
        since = record.info.get(IDLE_SINCE)
        if since is None or time.monotonic() - since <= PING_IF_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as exc:
            raise DisconnectionError(f"a pooled connection is gone: {exc}") from exc

    @event.listens_for(engine, "begin")
    def _postgres_begin(conn: Any) -> None:
        if conn.get_execution_options().get(UNSYNCED):
            conn.exec_driver_sql("SET LOCAL synchronous_commit = off")

    return engine


# An execution option: see unsynced().
UNSYNCED = "gpulease_unsynced"


def _sqlite_unsynced(dbapi_conn: Any, info: dict[Any, Any]) -> None:
    """SQLite: the pooled connection commits without waiting for the disk until it goes back
    to the pool, whose checkin (make_engine) sets synchronous=FULL again."""
    dbapi_conn.execute("PRAGMA synchronous=NORMAL")
    info[UNSYNCED] = True


# A pooled PostgreSQL connection's monotonic time of return to the pool, and how long it
# may sit there before its next checkout pings it first.
IDLE_SINCE = "gpulease_idle_since"
PING_IF_IDLE_S = 2.0


def unsynced(engine: Engine) -> Engine:
    """The engine whose transactions commit without waiting for the disk: on SQLite
    synchronous=NORMAL for the transaction (WAL stays consistent; an OS crash or a power cut
    may undo the last commits), on PostgreSQL synchronous_commit=off (a crash of the
    database server may undo them). For data that may lose its last second, such as metric
    points; never for money."""
    return engine.execution_options(**{UNSYNCED: True})


# What a PostgreSQL statement in a transaction of its own (statements()) selects, in a CTE
# that it reads, to commit as an unsynced() transaction does (set_config(..., true) is
# SET LOCAL: it lasts until that statement's commit, which it governs).
PG_UNSYNCED_SELECT = "SELECT set_config('synchronous_commit', 'off', true)"


def statements(engine: Engine) -> Engine:
    """PostgreSQL: the engine whose statements each run and commit in a transaction of
    their own (autocommit: no BEGIN or COMMIT to send), without unsynced()'s SET LOCAL (a
    statement selects PG_UNSYNCED_SELECT instead). For one-statement work on a hot path."""
    return engine.execution_options(isolation_level="AUTOCOMMIT", **{UNSYNCED: False})


# An execution option: see read_only().
READ_ONLY = "gpulease_read_only"


def read_only(engine: Engine) -> Engine:
    """The engine for transactions that only read (and must not write): on SQLite a deferred
    BEGIN, which takes no write lock, so that it neither waits for a writer nor makes one
    wait; on PostgreSQL no transaction at all (autocommit: each statement reads on its own,
    without the round trips of BEGIN and COMMIT)."""
    if engine.dialect.name == "sqlite":
        return engine.execution_options(**{READ_ONLY: True})
    return statements(engine)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


_READERS: weakref.WeakKeyDictionary[sessionmaker[Session], sessionmaker[Session]] = (
    weakref.WeakKeyDictionary()
)


def readers(sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    """The read-only sessions (read_only) of the database sessions opens, made once for
    each sessionmaker: on SQLite their transactions take no write lock, so a request that
    only reads neither waits for nor holds up the writes of the requests beside it."""
    found = _READERS.get(sessions)
    if found is None:
        found = _READERS[sessions] = make_sessionmaker(read_only(sessions.kw["bind"]))
    return found


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commits on success, rolls back on any exception."""
    with factory() as session, session.begin():
        yield session


def batches(items: Sequence[_T], size: int | None = None) -> list[Sequence[_T]]:
    """items in slices of at most size (IN_BATCH), in order: one query each for an `IN`
    list."""
    size = size or IN_BATCH
    return [items[at : at + size] for at in range(0, len(items), size)]


def finds_any(sessions: sessionmaker[Session], statement: Select[Any]) -> bool:
    """Whether statement finds a row, asked in a read-only transaction (no SQLite write
    lock): what a reconciler step asks before the write transaction it usually has no
    work for."""
    with transaction(readers(sessions)) as session:
        return session.execute(statement.limit(1)).first() is not None


@contextmanager
def sqlite_write(engine: Engine) -> Iterator[sqlite3.Connection]:
    """SQLite: a write transaction on a pooled connection, without an ORM session, for the
    hottest writes (a runner's metric batch, where the session's own work cost about a
    millisecond, as much as storing a thousand points): BEGIN IMMEDIATE, as every write
    transaction begins, committed on success, rolled back on any exception. An unsynced()
    engine's transaction commits with synchronous=NORMAL, as transaction() does; the
    connection is synced again when it goes back to the pool."""
    if engine.dialect.name != "sqlite":
        raise ValueError("sqlite_write is for SQLite engines")
    pooled = engine.raw_connection()
    try:
        conn: sqlite3.Connection = pooled.driver_connection  # type: ignore[assignment]
        if engine.get_execution_options().get(UNSYNCED):
            _sqlite_unsynced(conn, pooled.info)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:  # SQLite may have ended it itself (a full disk)
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    finally:
        pooled.close()  # back to the pool, which rolls back whatever a failed COMMIT left


VERSION_TABLE = "alembic_version"  # Alembic's record of the schema's revision


def _scripts_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def alembic_config(engine: Engine) -> Config:
    cfg = _scripts_config()
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return cfg


@functools.cache
def head_revision() -> str | None:
    """The newest revision of the migrations this code ships with."""
    return ScriptDirectory.from_config(_scripts_config()).get_current_head()


def schema_revisions(conn: Connection) -> list[str]:
    """The revisions the database's version table holds (exactly one once migrated)."""
    rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))
    return [str(row[0]) for row in rows]


def at_head(conn: Connection) -> bool:
    """Whether the database's schema is already the newest revision (one small read)."""
    return inspect(conn).has_table(VERSION_TABLE) and schema_revisions(conn) == [head_revision()]


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision. A database already there costs one read (a
    restart, every test's copy of a migrated database) instead of Alembic's whole run.
    Replicas starting together on Postgres take an advisory lock so that exactly one of
    them runs the migration."""
    with engine.connect() as conn:
        done = at_head(conn)
        conn.commit()  # the read's transaction ends before the lock is waited for
        if done:
            return
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_lock(7426)"))
        try:
            cfg = alembic_config(engine)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
        finally:
            if engine.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_unlock(7426)"))
                conn.commit()


def for_update(engine_or_session: Session) -> dict[str, Any]:
    """Options for select(...).with_for_update(**): row locks that skip rows another replica
    holds on Postgres; SQLite serialises writers itself and ignores them."""
    return {"skip_locked": True}


# -- PostgreSQL from the event loop ------------------------------------------------------

AsyncPool = AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]]
# How async_pool's connections name themselves to PostgreSQL (pg_stat_activity), unless the
# database URL names one.
ASYNC_APPLICATION_NAME = "gpulease async"


class BinaryArray:
    """A PostgreSQL array already in its binary wire form (see pg_array), as a parameter of
    execute_async with a %(name)b placeholder: psycopg sends its bytes as they are, typed
    as the array type `oid`. psycopg's own dumper of a Python list calls a dumper per
    element: 1.8 ms for five lists of 1,000, where struct packs them in 0.5 ms."""

    __slots__ = ("data", "oid")

    def __init__(self, data: bytes, oid: int) -> None:
        self.data = data
        self.oid = oid


class _BinaryArrayDumper(Dumper):
    format = pq.Format.BINARY

    def get_key(self, obj: Any, format: PyFormat) -> Any:
        return (BinaryArray, obj.oid)

    def upgrade(self, obj: Any, format: PyFormat) -> Dumper:
        dumper = _BinaryArrayDumper(BinaryArray)
        dumper.oid = obj.oid
        return dumper

    def dump(self, obj: Any) -> bytes:
        data: bytes = obj.data
        return data


def pg_array(elements: bytes, count: int, element_oid: int, array_oid: int) -> BinaryArray:
    """A one-dimensional array without NULLs of `count` elements, each already written as
    its 4-byte big-endian length and its binary value, in PostgreSQL's array wire form."""
    head = struct.pack(">iiIii", 1, 0, element_oid, count, 1)  # dims, no NULLs, type, size, base
    return BinaryArray(head + elements, array_oid)


def async_pool(engine: Engine, *, max_size: int = 10) -> AsyncPool:
    """PostgreSQL: a pool of psycopg's async connections to the engine's database, each in
    autocommit (a statement is a transaction of its own, as statements() makes the engine's),
    for a hot path's one statement awaited on the event loop itself: no worker thread, whose
    two hops cost more than the statement's round trip on a loaded host. It connects as the
    engine's own connections do (the dialect's arguments and adapters, and BinaryArray's
    dumper). Not opened: open it
    (await pool.open()) in the event loop that uses it, and close it there."""
    _, params = engine.dialect.create_connect_args(engine.url)
    params.setdefault("application_name", ASYNC_APPLICATION_NAME)
    adapters = AdaptersMap(params.get("context") or psycopg.adapters)  # a copy: the engine's stay
    adapters.register_dumper(BinaryArray, _BinaryArrayDumper)
    params["context"] = adapters
    return AsyncConnectionPool(
        kwargs={**params, "autocommit": True},
        min_size=1,
        max_size=max_size,
        open=False,
        name="gpulease-async",
        timeout=10.0,  # a connection waited for longer answers 500 before a runner gives up
    )


async def execute_async(pool: AsyncPool, query: str, params: dict[str, Any]) -> int:
    """Run one statement (psycopg's %(name)s parameters) on a connection of the pool and
    return its rowcount. A connection found dead (the database restarted, or its backend
    was terminated) is thrown away, the pool's idle connections are checked (a restart
    killed them all; the pool replaces each dead one), and the statement runs once more on
    another connection. The caller's statement must be safe to run twice (it may have
    committed before the connection died)."""
    async with pool.connection() as conn:
        try:
            return await _rowcount_of(conn, query, params)
        except psycopg.OperationalError:
            if not conn.broken:
                raise
    await pool.check()
    async with pool.connection() as conn:
        return await _rowcount_of(conn, query, params)


async def _rowcount_of(
    conn: AsyncConnection[tuple[Any, ...]], query: str, params: dict[str, Any]
) -> int:
    cursor = await conn.execute(query, params)
    return max(cursor.rowcount, 0)
