"""The database part of a backup: every table as gzip'd JSON lines, read in one snapshot, and
loaded back into a schema migrated to the same revision.

Why a table dump through SQLAlchemy rather than pg_dump or a copy of the SQLite file: one
format and one code path for SQLite and PostgreSQL (tested on both), no client binaries that
must match the PostgreSQL server's major version, and a backup of one database restores into
the other. Consistency: PostgreSQL reads every table in one REPEATABLE READ, READ ONLY
transaction; SQLite is first copied with its online backup API (a consistent copy that does
not hold writers back), and the copy is read.
"""

from __future__ import annotations

import base64
import gzip
import json
import sqlite3
import tempfile
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from alembic import command
from sqlalchemy import Connection, Engine, MetaData, Table, create_engine, inspect, select, text
from sqlalchemy.engine import make_url

from gpulease.server.backups.progress import Advance, Step
from gpulease.server.db import VERSION_TABLE, alembic_config, normalize_url, schema_revisions

BATCH_ROWS = 1000
# Columns holding paths under the data directory; rewritten when it moved (see load_tables).
PATH_COLUMNS = ("workspace", "workdir_upload")


def dialect_of(url: str) -> str:
    return make_url(normalize_url(url)).get_backend_name()


def encode(value: Any) -> Any:
    """A column value as JSON: plain scalars as they are, the rest tagged ({"$bytes": …})."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, date):
        return {"$date": value.isoformat()}
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, dict | list):
        return {"$json": value}
    return {"$text": str(value)}


def decode(value: Any) -> Any:
    """The inverse of encode. Datetimes come back aware: gpulease stores UTC everywhere, so
    a zone-less one (as SQLite keeps them) is UTC."""
    if not isinstance(value, dict):
        return value
    ((tag, raw),) = value.items()
    if tag == "$datetime":
        moment = datetime.fromisoformat(raw)
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    if tag == "$date":
        return date.fromisoformat(raw)
    if tag == "$decimal":
        return Decimal(raw)
    if tag == "$bytes":
        return base64.b64decode(raw)
    if tag in ("$json", "$text"):
        return raw
    raise ValueError(f"unknown value tag {tag!r}")


def _tables(conn: Connection) -> list[Table]:
    metadata = MetaData()
    metadata.reflect(bind=conn)
    return [t for t in metadata.sorted_tables if t.name != VERSION_TABLE]


def _revision(conn: Connection) -> str:
    revisions = schema_revisions(conn)
    if len(revisions) != 1:
        raise ValueError(f"the database has schema revisions {revisions}; expected exactly one")
    return str(revisions[0])


def _write_table(conn: Connection, table: Table, out_dir: Path, advance: Advance) -> int:
    order = list(table.primary_key.columns) or list(table.columns)
    rows = 0
    with gzip.open(out_dir / f"{table.name}.jsonl.gz", "wt", encoding="utf-8") as out:
        result = conn.execution_options(yield_per=BATCH_ROWS).execute(
            select(table).order_by(*order)
        )
        for row in result.mappings():
            out.write(json.dumps({k: encode(v) for k, v in row.items()}, sort_keys=True))
            out.write("\n")
            rows += 1
            if rows % BATCH_ROWS == 0:
                advance(BATCH_ROWS)
    advance(rows % BATCH_ROWS)
    return rows


def _dump(conn: Connection, out_dir: Path, step: Step) -> dict[str, Any]:
    tables = _tables(conn)
    revision = _revision(conn)
    advance = step("database tables", None, "rows")
    counts = {table.name: _write_table(conn, table, out_dir, advance) for table in tables}
    return {"revision": revision, "tables": counts}


def dump_database(url: str, out_dir: Path, step: Step) -> dict[str, Any]:
    """Write every table of the database at url to out_dir/<table>.jsonl.gz from one
    consistent snapshot; returns {"dialect", "revision", "tables": {name: rows}}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dialect = dialect_of(url)
    if dialect == "sqlite":
        source = make_url(normalize_url(url)).database
        if not source or source == ":memory:":
            raise ValueError("an in-memory SQLite database cannot be backed up")
        with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=".snapshot-") as work:
            copy = Path(work) / "snapshot.db"
            _sqlite_snapshot(Path(source), copy)
            engine = create_engine(f"sqlite:///{copy}")
            try:
                with engine.connect() as conn:
                    info = _dump(conn, out_dir, step)
            finally:
                engine.dispose()
    else:
        engine = create_engine(normalize_url(url))
        try:
            with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                info = _dump(conn, out_dir, step)
                conn.rollback()
        finally:
            engine.dispose()
    return {"dialect": dialect, **info}


def _sqlite_snapshot(source: Path, copy: Path) -> None:
    """A consistent copy of a live SQLite database (its online backup API)."""
    if not source.exists():
        raise FileNotFoundError(f"the SQLite database {source} does not exist")
    src = sqlite3.connect(source)
    dst = sqlite3.connect(copy)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


def database_is_empty(engine: Engine) -> bool:
    return not inspect(engine).get_table_names()


def drop_everything(engine: Engine) -> None:
    """Drop every table (gpulease's and alembic's) of the database: `restore --force`."""
    metadata = MetaData()
    with engine.begin() as conn:
        metadata.reflect(bind=conn)
        metadata.drop_all(bind=conn)


def migrate_to(engine: Engine, revision: str) -> None:
    """Bring an empty database's schema to exactly `revision` (or "head")."""
    with engine.connect() as conn:
        cfg = alembic_config(engine)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        conn.commit()


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            yield {k: decode(v) for k, v in json.loads(line).items()}


def load_tables(
    engine: Engine,
    in_dir: Path,
    counts: dict[str, int],
    advance: Advance,
    moved_home: tuple[str, str] | None = None,
) -> None:
    """Insert the dumped rows into the (migrated, empty) database, parents before children,
    then move PostgreSQL's id sequences past the restored ids. moved_home=(old, new): path
    columns that pointed into the old data directory point into the new one."""
    with engine.begin() as conn:
        tables = {t.name: t for t in _tables(conn)}
        missing = sorted(set(counts) - set(tables))
        if missing:
            raise ValueError(f"the backup has tables this schema lacks: {', '.join(missing)}")
        for name, table in tables.items():
            if name not in counts:
                continue
            batch: list[dict[str, Any]] = []
            for row in _rows(in_dir / f"{name}.jsonl.gz"):
                if moved_home is not None:
                    _move_paths(row, *moved_home)
                batch.append(row)
                if len(batch) >= BATCH_ROWS:
                    conn.execute(table.insert(), batch)
                    advance(len(batch))
                    batch = []
            if batch:
                conn.execute(table.insert(), batch)
                advance(len(batch))
        if engine.dialect.name == "postgresql":
            for table in tables.values():
                _advance_sequences(conn, table)


def _move_paths(row: dict[str, Any], old: str, new: str) -> None:
    for column in PATH_COLUMNS:
        value = row.get(column)
        if isinstance(value, str) and (value == old or value.startswith(old + "/")):
            row[column] = new + value[len(old) :]


def _advance_sequences(conn: Connection, table: Table) -> None:
    for column in table.primary_key.columns:
        try:
            if column.type.python_type is not int:
                continue
        except NotImplementedError:
            continue
        conn.execute(
            text(
                f"SELECT setval(pg_get_serial_sequence(:table, :column), "
                f'COALESCE(MAX("{column.name}"), 1), MAX("{column.name}") IS NOT NULL) '
                f'FROM "{table.name}"'
            ),
            {"table": f'"{table.name}"', "column": column.name},
        )
