"""Metric points of runs: batched ingest that a retry cannot duplicate, series for charts."""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, NotRequired, cast

import psycopg
from pydantic import Field, TypeAdapter, ValidationError
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session, sessionmaker
from typing_extensions import TypedDict  # pydantic reads typing's only from Python 3.12

from gpulease.core.errors import InvalidInput
from gpulease.schemas.metrics import (
    METRIC_KEY,
    METRIC_KEY_PATTERN,
    MetricPointPublic,
    MetricSeries,
    RunMetrics,
)
from gpulease.schemas.runner import RunnerMetrics
from gpulease.schemas.runs import RunPublic
from gpulease.server.db import (
    PG_UNSYNCED_SELECT,
    AsyncPool,
    BinaryArray,
    execute_async,
    pg_array,
    sqlite_write,
    transaction,
)
from gpulease.server.orm import MetricPoint, Run
from gpulease.server.security import hash_token
from gpulease.server.services import runners
from gpulease.server.services.metrics.downsample import min_max_indices

KEY_PATTERN = METRIC_KEY_PATTERN
Source = Literal["sdk", "tensorboard", "stdout"]
# the sources, also in the order of preference when two report one step
SOURCES: tuple[Source, ...] = ("sdk", "tensorboard", "stdout")
MAX_BATCH = 5000
MAX_STEP = 2**63 - 1
MAX_SERIES = 50
MIN_POINTS, MAX_POINTS = 10, 20_000
_EARLIEST, _LATEST = 946_684_800.0, 4_102_444_800.0  # 2000-01-01 .. 2100-01-01
# The run with that id of the instance that holds the runner token with that hash: the
# whole authorisation of a runner's batch, in one statement.
_RUN_OF_TOKEN = (
    "SELECT runs.id FROM runs JOIN instances ON instances.id = runs.instance_id "
    "AND instances.runner_token_hash = :token_hash WHERE runs.id = :run_id"
)
# One statement over the batch as JSON (pydantic writes it; no per-value parameters). Times
# become timestamps exactly as datetime.fromtimestamp rounds them: the whole seconds plus the
# fraction's microseconds, rounded half to even (PostgreSQL's round of a double is C's rint).
# On a conflict the first point of the statement is kept: rows go in in the array's order.
# The statement checks the run itself and locks it FOR KEY SHARE (what the foreign key did
# for each point, once), so the run cannot be deleted before the points commit; with the
# runner's token, it also checks that the run is one of the token's instance's.
_PG_INSERT = (
    "WITH {ctes}run AS ({run} FOR KEY SHARE OF runs) "
    "INSERT INTO metric_points (run_id, key, step, value, time, source) "
    "SELECT run.id, p.key, p.step, p.value, "
    "to_timestamp(trunc(p.time)) "
    "+ round((p.time - trunc(p.time)) * 1e6) * interval '1 microsecond', "
    "coalesce(p.source, 'sdk') FROM {tables}run, {points}"
)
_JSON_POINTS = (
    "json_to_recordset(CAST(:points AS json)) AS "
    "p(key varchar, step bigint, value double precision, time double precision, source varchar)"
)
_PG_SKIP_KNOWN = " ON CONFLICT (run_id, key, step, source) DO NOTHING"
# Points of a run, insert-or-ignore (of a batch's repeats the first is kept).
_PG_STORE = text(
    _PG_INSERT.format(
        ctes="",
        run="SELECT runs.id FROM runs WHERE runs.id = :run_id",
        tables="",
        points=_JSON_POINTS,
    )
    + _PG_SKIP_KNOWN
)
# A runner's batch of new points, as a transaction of its own (the statement makes its own
# commit unsynced): a plain INSERT, which costs PostgreSQL less per point than ON CONFLICT's
# speculative insertion, and fails on a point the run already has (a resent batch), which
# then goes through _PG_STORE.
_NEW_POINTS = {"ctes": f"unsynced AS ({PG_UNSYNCED_SELECT}), ", "tables": "unsynced, "}
# The same in the driver's qmark style, for _sqlite_store_run_points.
_SQLITE_RUN_OF_TOKEN = _RUN_OF_TOKEN.replace(":token_hash", "?").replace(":run_id", "?")


def _psycopg_style(statement: str) -> str:
    """A statement's :name parameters as psycopg's own %(name)s (for execute_async)."""
    return re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", statement)


# The points as five arrays in PostgreSQL's binary format (_pg_arrays; psycopg's %(name)b:
# each number as its 8 bytes, no text to parse), in the batch's order. PostgreSQL's CPU
# for 1,000 new points: 4.8-5.2 ms from json_to_recordset, 3.7-4.5 ms from these (a scratch
# table of the same indexes, unsynced commits, 100 batches each in turns); the server packs
# them in about 0.5 ms, as long as pydantic takes to write the JSON.
_ARRAY_POINTS = (
    "unnest(CAST(%(keys)b AS varchar[]), CAST(%(steps)b AS bigint[]), "
    "CAST(%(values)b AS double precision[]), CAST(%(times)b AS double precision[]), "
    "CAST(%(sources)b AS varchar[])) AS p(key, step, value, time, source)"
)
# The new points' statement over those arrays, for psycopg's async connections
# (store_run_points_on_loop), and the token's run alone (an empty batch).
_PG_STORE_NEW_ASYNC = _psycopg_style(
    _PG_INSERT.format(run=_RUN_OF_TOKEN, points=_ARRAY_POINTS, **_NEW_POINTS)
)
_PG_RUN_OF_TOKEN_ASYNC = _psycopg_style(_RUN_OF_TOKEN)
_SQLITE_INSERT = (
    "INSERT INTO metric_points (run_id, key, step, value, time, source) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, key, step, source) DO NOTHING"
)


class WirePoint(TypedDict):
    """A point as the runner's JSON carries it (schemas.runner.RunnerMetricPoint), with every
    rule of _check written as a constraint, so that one pydantic pass checks a whole batch."""

    key: Annotated[str, Field(pattern=f"^{METRIC_KEY}$")]
    step: Annotated[int, Field(ge=0, le=MAX_STEP)]
    value: Annotated[float, Field(allow_inf_nan=False)]
    time: Annotated[float, Field(ge=_EARLIEST, le=_LATEST)]
    source: NotRequired[Source]


class _WireBatch(TypedDict):
    points: Annotated[list[WirePoint], Field(max_length=MAX_BATCH)]


_BATCH = TypeAdapter(_WireBatch)
_POINTS = TypeAdapter(list[WirePoint])


@dataclass(frozen=True)
class PointIn:
    """A point as a runner sends it: time in Unix seconds."""

    key: str
    step: int
    value: float
    time: float
    source: str = "sdk"


def _check(index: int, p: PointIn) -> None:
    where = f"point {index} ({p.key!r} at step {p.step})"
    if not KEY_PATTERN.match(p.key):
        raise InvalidInput(
            f"{where}: {p.key!r} is not a metric key; a key starts with a letter or _, then up "
            "to 63 letters, digits or _ . / - (for example 'loss' or 'val/acc')"
        )
    if not 0 <= p.step <= MAX_STEP:
        raise InvalidInput(f"{where}: the step must be a whole number from 0 to 2^63-1")
    if not math.isfinite(p.value):
        raise InvalidInput(
            f"{where}: the value {p.value} is not a finite number; leave NaN and infinite "
            "values out of the batch"
        )
    if not (math.isfinite(p.time) and _EARLIEST <= p.time <= _LATEST):
        raise InvalidInput(f"{where}: time must be Unix seconds (as time.time() gives)")
    if p.source not in SOURCES:
        raise InvalidInput(f"{where}: source must be one of {', '.join(SOURCES)}")


def parse_points(raw: bytes) -> list[WirePoint]:
    """A runner's batch, {"points": [...]}, from its JSON bytes, checked in one pass. A batch
    that fails is read again point by point, to say which point is wrong and why."""
    try:
        return _BATCH.validate_json(raw)["points"]
    except ValidationError as exc:
        raise _refusal(raw, exc) from None


def _refusal(raw: bytes, exc: ValidationError) -> InvalidInput:
    """What is wrong with a batch that parse_points refused, in _check's words where it can."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    refusal = InvalidInput(
        f"invalid batch: {where}: {first['msg']}; send "
        '{"points": [{"key": ..., "step": ..., "value": ..., "time": ..., "source": ...}]}'
    )
    try:
        body = json.loads(raw)  # NaN and Infinity too, to name them
        count = len(body["points"])
        if count > MAX_BATCH:
            return InvalidInput(f"{count} points in one batch; send at most {MAX_BATCH}")
        for i, p in enumerate(RunnerMetrics.model_validate(body).points):
            _check(i, PointIn(p.key, p.step, p.value, p.time, p.source))
    except InvalidInput as named:
        return named
    except (ValueError, TypeError, KeyError, ValidationError):
        pass
    return refusal


def ingest_points(session: Session, run: Run, points: Sequence[PointIn]) -> int:
    """Store a batch of a run's points (see store_points); any invalid point refuses the whole
    batch."""
    if len(points) > MAX_BATCH:
        raise InvalidInput(f"{len(points)} points in one batch; send at most {MAX_BATCH}")
    for i, p in enumerate(points):
        _check(i, p)
    return store_points(
        session,
        run,
        [
            WirePoint(
                key=p.key,
                step=p.step,
                value=float(p.value),
                time=p.time,
                source=cast(Source, p.source),  # one of SOURCES: _check says so
            )
            for p in points
        ],
    )


def store_points(session: Session, run: Run, points: list[WirePoint]) -> int:
    """Store checked points of a run (from parse_points); returns how many were new. A
    (key, step, source) the run already has is skipped (insert-or-ignore, on SQLite and
    PostgreSQL alike), so a retried batch stores nothing twice; of a batch's own repeats the
    first is kept."""
    return _store(session, run.id, points)


def _store(session: Session, run_id: int, points: list[WirePoint]) -> int:
    if not points:
        return 0
    if _postgres(session):
        return _rowcount(session.execute(_PG_STORE, {"run_id": run_id, "points": _json(points)}))
    # SQLite: the driver's executemany of plain tuples, without SQLAlchemy's per-row work
    rows = _sqlite_rows(run_id, points)
    return _rowcount(session.connection().exec_driver_sql(_SQLITE_INSERT, rows))


def store_run_points(
    unsynced_sessions: sessionmaker[Session],
    runner_token: str,
    run_id: int,
    points: list[WirePoint],
) -> int:
    """A runner's batch for one of its instance's runs: the token's instance, the run and
    the points in one transaction whose commit does not wait for the disk
    (Runtime.unsynced_sessions; the flush cost more than the points themselves, and a crash
    of the machine may lose the last second of a curve, never money). Returns how many
    points were new; 401 for an unknown token, 404 for a run of another instance; known
    points are skipped.

    On SQLite one statement finds the token's run (_RUN_OF_TOKEN) in the batch's
    transaction, on the driver's connection without an ORM session; the look-ups that say
    why run only when it finds none. On PostgreSQL the server stores a batch of new points
    with one statement on the event loop (store_run_points_on_loop); this answers what that
    statement did not store."""
    if not _postgres(unsynced_sessions):
        stored = _sqlite_store_run_points(
            unsynced_sessions.kw["bind"], hash_token(runner_token), run_id, points
        )
        if stored is not None:
            return stored
    with transaction(unsynced_sessions) as session:
        # 401 for an unknown token, 404 for a run that is not the token's instance's
        runners.run_of(session, runners.instance_for_token(session, runner_token), run_id)
        return _store(session, run_id, points)


def _sqlite_store_run_points(
    engine: Engine, token_hash: str, run_id: int, points: list[WirePoint]
) -> int | None:
    """SQLite: the batch in one write transaction of the driver's own (db.sqlite_write): the
    token's run found by one statement (_RUN_OF_TOKEN), then the points. None, having stored
    nothing, when the token has no such run: store_run_points then says why."""
    with sqlite_write(engine) as conn:
        if conn.execute(_SQLITE_RUN_OF_TOKEN, (token_hash, run_id)).fetchone() is None:
            return None
        if not points:
            return 0
        return _rowcount(conn.executemany(_SQLITE_INSERT, _sqlite_rows(run_id, points)))


async def store_run_points_on_loop(
    pool: AsyncPool, runner_token: str, run_id: int, points: list[WirePoint]
) -> int | None:
    """PostgreSQL, awaited on the event loop over the pool's async connection: store_run_points'
    one statement (the token's instance, the run locked FOR KEY SHARE, the plain INSERT,
    committed unsynced, one round trip), without a worker thread. Returns how many points
    were stored, or None when store_run_points must answer the batch: the
    statement stored nothing (an unknown token, another instance's run: it says which) or
    met a point the run already has (it stores the new ones). An empty batch is the token's
    run looked up alone (0 when found). A connection that died is replaced and the statement
    sent again (db.execute_async): a batch that committed before its connection died then
    meets its own points and goes the general way, which stores nothing twice."""
    params: dict[str, object] = {"run_id": run_id, "token_hash": hash_token(runner_token)}
    if not points:
        return 0 if await execute_async(pool, _PG_RUN_OF_TOKEN_ASYNC, params) else None
    try:
        stored = await execute_async(pool, _PG_STORE_NEW_ASYNC, params | _pg_arrays(points))
    except psycopg.errors.UniqueViolation:
        return None
    return stored or None


_INT8, _FLOAT8, _VARCHAR = 20, 701, 1043  # PostgreSQL's type oids: element, then its array
_INT8_ARRAY, _FLOAT8_ARRAY, _VARCHAR_ARRAY = 1016, 1022, 1015


def _pg_arrays(points: list[WirePoint]) -> dict[str, BinaryArray]:
    """The keys, steps, values, times and sources of checked points as _ARRAY_POINTS's
    binary arrays: each element its length and value, numbers packed by struct in one call
    per array (8 bytes each, big-endian), each distinct text encoded once."""
    count = len(points)
    eights = [8] * count

    def numbers(code: str, values: list[Any]) -> bytes:
        interleaved: list[Any] = [0] * (2 * count)
        interleaved[0::2] = eights
        interleaved[1::2] = values
        return struct.pack(">" + ("i" + code) * count, *interleaved)

    def texts(values: list[str]) -> bytes:
        written: dict[str, bytes] = {}
        parts = []
        for value in values:
            part = written.get(value)
            if part is None:
                data = value.encode()
                part = written[value] = struct.pack(">i", len(data)) + data
            parts.append(part)
        return b"".join(parts)

    steps = numbers("q", [p["step"] for p in points])
    values = numbers("d", [p["value"] for p in points])
    times = numbers("d", [p["time"] for p in points])
    keys = texts([p["key"] for p in points])
    sources = texts([p.get("source", "sdk") for p in points])
    return {
        "keys": pg_array(keys, count, _VARCHAR, _VARCHAR_ARRAY),
        "steps": pg_array(steps, count, _INT8, _INT8_ARRAY),
        "values": pg_array(values, count, _FLOAT8, _FLOAT8_ARRAY),
        "times": pg_array(times, count, _FLOAT8, _FLOAT8_ARRAY),
        "sources": pg_array(sources, count, _VARCHAR, _VARCHAR_ARRAY),
    }


def _postgres(bind: Session | sessionmaker[Session]) -> bool:
    engine = bind.get_bind() if isinstance(bind, Session) else bind.kw["bind"]
    return bool(engine.dialect.name == "postgresql")


def _rowcount(result: object) -> int:
    return max(int(getattr(result, "rowcount", 0)), 0)


def _json(points: list[WirePoint]) -> str:
    return _POINTS.dump_json(points).decode()


# "HH:MM:" of each minute of a day and "SS." of each second: a point's clock is two joins,
# not a format of four numbers.
_HOURS_MINUTES = ["%02d:%02d:" % divmod(minute, 60) for minute in range(1440)]  # noqa: UP031
_SECONDS = ["%02d." % second for second in range(60)]  # noqa: UP031


def _sqlite_rows(run_id: int, points: list[WirePoint]) -> list[tuple[Any, ...]]:
    """The points as rows for _SQLITE_INSERT, times as UTCDateTime writes them (naive UTC,
    "YYYY-MM-DD HH:MM:SS.ffffff") and as datetime.fromtimestamp rounds them (the fraction's
    microseconds half to even, 1,000,000 carried into the second), in arithmetic: one date a
    day, one "date HH:MM:SS." a second that the point before was not in (a batch of a run's
    last half second is mostly one), joined from the tables above, and the microseconds.
    Against a datetime and its isoformat per distinct time (medians in turns): 2.0 -> 1.2 ms
    for 1,000 points a second apart, 1.8 -> 0.4 ms for 1,000 in half a second; the tables
    then took the first to 1.06 ms from 1.81 (best of 30 rounds each)."""
    rows: list[tuple[Any, ...]] = []
    append = rows.append
    days: dict[int, str] = {}
    floor = math.floor
    hours_minutes, seconds_of = _HOURS_MINUTES, _SECONDS
    last, prefix = -1, ""
    for p in points:
        unix = p["time"]
        seconds = floor(unix)  # times are positive: the fraction is exact
        micro = round((unix - seconds) * 1e6)  # round() of a float is half to even
        if micro == 1_000_000:
            seconds, micro = seconds + 1, 0
        if seconds != last:
            day, second = divmod(seconds, 86_400)
            date = days.get(day)
            if date is None:
                date = days[day] = datetime.fromtimestamp(day * 86_400, UTC).strftime("%Y-%m-%d ")
            minute, second = divmod(second, 60)
            last, prefix = seconds, date + hours_minutes[minute] + seconds_of[second]
        stamp = prefix + "%06d" % micro  # noqa: UP031
        append((run_id, p["key"], p["step"], p["value"], stamp, p.get("source", "sdk")))
    return rows


def metric_keys(session: Session, run: Run) -> list[str]:
    return list(
        session.scalars(
            select(MetricPoint.key)
            .where(MetricPoint.run_id == run.id)
            .distinct()
            .order_by(MetricPoint.key)
        )
    )


def last_point_id(session: Session, run: Run) -> int:
    found = session.scalar(select(func.max(MetricPoint.id)).where(MetricPoint.run_id == run.id))
    return int(found or 0)


def check_max_points(max_points: int) -> int:
    if not MIN_POINTS <= max_points <= MAX_POINTS:
        raise InvalidInput(f"max_points must be from {MIN_POINTS} to {MAX_POINTS}")
    return max_points


def parse_keys(text: str | None) -> list[str] | None:
    """'loss,acc' → ['loss', 'acc']; None or empty → None (every key)."""
    if text is None or not text.strip():
        return None
    keys = [k.strip() for k in text.split(",") if k.strip()]
    for key in keys:
        if not KEY_PATTERN.match(key):
            raise InvalidInput(
                f"{key!r} is not a metric key; list keys separated by commas, e.g. keys=loss,acc"
            )
    if len(keys) > MAX_SERIES:
        raise InvalidInput(f"at most {MAX_SERIES} keys at once")
    return keys


def _key_series(key: str, rows: list[Any], max_points: int) -> MetricSeries:
    """One key's rows (step, value, time, source; ordered by step) as a chart series. When
    two sources report the same step, the SDK's point wins over TensorBoard's over stdout's."""
    steps: list[int] = []
    values: list[float] = []
    times: list[datetime] = []
    ranks: list[int] = []
    for step, value, time, source in rows:
        rank = SOURCES.index(source) if source in SOURCES else len(SOURCES)
        if steps and steps[-1] == step:
            if rank < ranks[-1]:
                values[-1], times[-1], ranks[-1] = value, time, rank
            continue
        steps.append(step)
        values.append(value)
        times.append(time)
        ranks.append(rank)
    kept = min_max_indices(values, max_points)
    return MetricSeries(
        key=key,
        raw_count=len(rows),
        count=len(steps),
        downsampled=len(kept) < len(steps),
        steps=[steps[i] for i in kept],
        values=[values[i] for i in kept],
        times=[times[i].timestamp() for i in kept],
        last_step=steps[-1] if steps else None,
        last_value=values[-1] if values else None,
        min=min(values) if values else None,
        max=max(values) if values else None,
    )


def series(
    session: Session, run: Run, keys: list[str] | None = None, max_points: int = 2000
) -> RunMetrics:
    """The run's curves for a chart, each downsampled to at most max_points (the raw points
    stay stored; see points_csv), with every key the run has and the last point's id (a
    stream resumes after it). Series come in the order of `keys` (None: every key,
    alphabetically, at most 50); a key without points has empty lists.
    """
    check_max_points(max_points)
    all_keys = metric_keys(session, run)
    wanted = keys if keys is not None else all_keys[:MAX_SERIES]
    last_id = last_point_id(session, run)
    result = []
    for key in wanted:
        rows = session.execute(
            select(MetricPoint.step, MetricPoint.value, MetricPoint.time, MetricPoint.source)
            .where(MetricPoint.run_id == run.id, MetricPoint.key == key)
            .order_by(MetricPoint.step)
        ).all()
        result.append(_key_series(key, list(rows), max_points))
    return RunMetrics(
        run=RunPublic.model_validate(run),
        keys=all_keys,
        max_points=max_points,
        last_point_id=last_id,
        series=result,
    )


def point_public(p: MetricPoint) -> MetricPointPublic:
    return MetricPointPublic(
        id=p.id, key=p.key, step=p.step, value=p.value, time=p.time.timestamp(), source=p.source
    )


def points_after(
    session: Session, run: Run, after_id: int, limit: int = 5000, keys: list[str] | None = None
) -> list[MetricPointPublic]:
    """Points stored after the point with id after_id, in the order they were stored."""
    query = select(MetricPoint).where(MetricPoint.run_id == run.id, MetricPoint.id > after_id)
    if keys is not None:
        query = query.where(MetricPoint.key.in_(keys))
    return [point_public(p) for p in session.scalars(query.order_by(MetricPoint.id).limit(limit))]


def points_csv(session: Session, run: Run) -> Iterator[str]:
    """Every raw point of the run as CSV lines (header first): key,step,value,time,source,
    time as ISO 8601 UTC, ordered by key, step, source."""
    yield "key,step,value,time,source\n"
    rows = session.execute(
        select(
            MetricPoint.key,
            MetricPoint.step,
            MetricPoint.value,
            MetricPoint.time,
            MetricPoint.source,
        )
        .where(MetricPoint.run_id == run.id)
        .order_by(MetricPoint.key, MetricPoint.step, MetricPoint.source)
    )
    for key, step, value, time, source in rows:
        yield f"{key},{step},{value!r},{time.isoformat()},{source}\n"
