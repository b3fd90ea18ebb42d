"""The whole API under generated input (schemathesis): no request, however odd, answers 500.

Every operation of the OpenAPI schema is called with generated paths, queries and bodies, as
a user and as an admin, against the in-process app on SQLite, within a time budget. Every
other call aims its path at resources that exist (an instance, a run, a ticket, a team), so
that generated bodies reach the services rather than stopping at a 404, and every third one
also swaps each integer for one too large for a database column.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from starlette.testclient import TestClient

from factories import Caller

pytestmark = pytest.mark.fuzz

BUDGET_S = 60.0
EXAMPLES = 12
# streams hold the connection open until the run ends; the fuzzer would only wait on them
SKIP = ("/stream",)
HUGE = 2**64


def _huge(value: object) -> object:
    """value with every integer in it (not bools) made HUGE."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return HUGE
    if isinstance(value, dict):
        return {k: _huge(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_huge(v) for v in value]
    return value


@pytest.fixture
def database_url(sqlite_migrated: Path, tmp_path: Path) -> Iterator[str]:
    """SQLite only: the fuzzer looks for unhandled input, not for database differences."""
    shutil.copyfile(sqlite_migrated, tmp_path / "gpulease.db")
    yield f"sqlite:///{tmp_path / 'gpulease.db'}"


def _existing(ann: Caller) -> dict[str, object]:
    """Resources of ann's for the paths to name: path parameter -> value."""
    instance = ann.post("/api/v1/instances", json={"gpu": "T4:1", "name": "fuzzed"}).json()
    run = ann.post(f"/api/v1/instances/{instance['id']}/runs", json={"command": "true"}).json()
    ticket = ann.post("/api/v1/support/tickets", json={"subject": "s", "body": "b"}).json()
    ann.post("/api/v1/teams", json={"name": "fuzzers"})
    return {
        "ref": str(instance["id"]),
        "run_id": run["id"],
        "ticket_id": ticket["id"],
        "name": "fuzzers",
        "member": "ann",
    }


def _try(
    operation: schemathesis.APIOperation,
    caller: Caller,
    known: dict[str, object],
    aim: Iterator[int],
    failures: list[str],
) -> None:
    @given(case=operation.as_strategy())
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def call(case: schemathesis.Case) -> None:
        how = next(aim)
        if case.path_parameters and how:
            for key in case.path_parameters.keys() & known.keys():
                case.path_parameters[key] = known[key]
        if how == 2:
            case.body = _huge(case.body)
            case.query = _huge(case.query)  # type: ignore[assignment]
        what = f"{caller.name}: {case.method} {case.formatted_path} query={case.query} "
        what += f"body={case.body!r:.300}"
        try:  # the in-process client raises what the app did not handle (a 500)
            r = case.call(headers=caller.headers)
        except Exception as exc:
            failures.append(f"{what} -> {type(exc).__name__}: {exc}")
            return
        if r.status_code >= 500:
            failures.append(f"{what} -> {r.status_code} {r.text[:200]}")

    with contextlib.suppress(Unsatisfiable):  # an operation no valid case fits
        call()


def _fuzz(
    http: TestClient, callers: list[Caller], known: dict[str, object], deadline: float
) -> list[str]:
    schema = schemathesis.openapi.from_asgi("/openapi.json", http.app)
    operations = [result.ok() for result in schema.get_all_operations()]
    failures: list[str] = []
    aim = itertools.cycle([0, 1, 2])  # as generated, aimed, aimed with huge integers
    for caller, operation in itertools.product(callers, operations):
        if time.monotonic() > deadline:
            break
        if not any(part in operation.path for part in SKIP):
            _try(operation, caller, known, aim, failures)
    return failures


def test_no_generated_request_answers_500(http: TestClient, ann: Caller, admin: Caller) -> None:
    known = _existing(ann)
    failures = _fuzz(http, [ann, admin], known, time.monotonic() + BUDGET_S)
    assert not failures, f"{len(failures)} answers >= 500:\n" + "\n".join(failures[:40])
