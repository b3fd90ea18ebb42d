"""The whole API under generated input (schemathesis), on a real server: no request, however
odd, answers 5xx, and the server logs no traceback.

A uvicorn process (tests/fuzz_server.py: the production app and `serve`, with the fake
backend so that no runner starts), on SQLite and on PostgreSQL, is called over HTTP with
generated paths, queries and bodies for every operation of its OpenAPI schema, as a user
and as an admin, and every runner operation also as the runner of the user's instance.
A first round gives every (caller, operation) pair a case, so every route is reached however
slow the machine; later rounds give each pair more cases until the time budget is spent.
Every other case aims its path at resources that exist (an instance, a run, a ticket, a
team) so that generated bodies reach the services rather than stopping at a 404, and every
third one also swaps each integer for one too large for a database column. Streams (SSE)
are judged by their status line and closed.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from factories import ADMIN_PASSWORD, PASSWORD
from processes import free_port

pytestmark = pytest.mark.fuzz

BUDGET_S = 22.0  # per database, for the calls after the server is up; the first round always ends
ROUNDS = (1, 4, 12)  # cases per (caller, operation) pair in each round
HUGE = 2**64
LONG_POLL = "/runner/v1/commands"
LAUNCHER = Path(__file__).resolve().parents[3] / "fuzz_server.py"


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


@dataclass
class Server:
    url: str
    home: Path
    log: Path


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[Server]:
    """On SQLite and on PostgreSQL: some input is refused by one database and not the other
    (a NUL in a text column is a PostgreSQL error). The guessing limits are raised: the
    fuzzer's failed logins must not lock its own callers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEASE_")}
    env.update(
        GPULEASE_HOME=str(tmp_path / "home"),
        GPULEASE_DATABASE_URL=database_url,
        GPULEASE_PORT=str(port),
        GPULEASE_SIMULATED_GPUS="A100-80GB:2,T4:1",
        GPULEASE_ADMIN_PASSWORD=ADMIN_PASSWORD,
        GPULEASE_LOGIN_FAILURES_PER_ACCOUNT="100000",
        GPULEASE_LOGIN_FAILURES_PER_ADDRESS="100000",
        GPULEASE_REGISTRATIONS_PER_ADDRESS="100000",
        GPULEASE_TOKEN_FAILURES_PER_ADDRESS="100000",
        GPULEASE_NOTIFY_MAX_ATTEMPTS="1",
        GPULEASE_NOTIFY_TIMEOUT_S="1",
    )
    log = tmp_path / "server.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, str(LAUNCHER)], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"server exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no server: {log.read_text()[-3000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.2)
        yield Server(url, tmp_path / "home", log)
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@dataclass
class Caller:
    """A signed-in account; signs in again when a generated call revoked its token."""

    url: str
    name: str
    password: str
    token: str = ""
    refused: bool = False  # a call was answered 401 since the last check
    http: requests.Session = field(default_factory=requests.Session)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def sign_in(self, *, register: bool = False) -> None:
        path = "/api/v1/auth/register" if register else "/api/v1/auth/login"
        r = self.http.post(f"{self.url}{path}", json={"name": self.name, "password": self.password})
        assert r.status_code in (200, 201), r.text
        self.token = r.json()["token"]

    def still_signed_in(self) -> None:
        if (
            self.refused
            and self.http.get(f"{self.url}/api/v1/me", headers=self.headers).status_code == 401
        ):
            self.sign_in()
        self.refused = False

    def post(self, path: str, body: object) -> dict[str, object]:
        r = self.http.post(f"{self.url}{path}", json=body, headers=self.headers)
        assert r.status_code < 300, r.text
        result = r.json()
        assert isinstance(result, dict)
        return result


@dataclass
class RunnerCaller(Caller):
    """The runner of an instance (password: its launch secret), with a session of its own;
    a generated POST /runner/v1/session that succeeds gives it that token instead."""

    def sign_in(self, *, register: bool = False) -> None:
        own = "glr_" + secrets.token_urlsafe(32)
        headers = {"Authorization": f"Bearer {self.password}"}
        r = self.http.post(f"{self.url}/runner/v1/session", json={"token": own}, headers=headers)
        assert r.status_code == 204, r.text
        self.token = own

    def still_signed_in(self) -> None:
        self.refused = False  # a runner stopped or failed by a generated call stays so


def _launch_secret(server: Server, instance_id: object) -> str:
    """What the fuzz server's backend was given to launch the instance's runner."""
    path = server.home / "fuzz-runner-tokens" / str(instance_id)
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, "the instance's runner was never launched"
        time.sleep(0.1)
    return path.read_text()


def _existing(ann: Caller) -> dict[str, object]:
    """Resources of ann's for the paths to name: path parameter -> value."""
    instance = ann.post("/api/v1/instances", {"gpu": "T4:1", "name": "fuzzed"})
    run = ann.post(f"/api/v1/instances/{instance['id']}/runs", {"command": "true"})
    ticket = ann.post("/api/v1/support/tickets", {"subject": "s", "body": "b"})
    ann.post("/api/v1/teams", {"name": "fuzzers"})
    return {
        "ref": str(instance["id"]),
        "run_id": run["id"],
        "ticket_id": ticket["id"],
        "name": "fuzzers",
        "member": "ann",
    }


@dataclass
class Fuzz:
    known: dict[str, object]
    failures: list[str] = field(default_factory=list)
    reached: set[tuple[str, str]] = field(default_factory=set)
    calls: int = 0
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    strategies: dict[str, Any] = field(default_factory=dict)
    aim: Iterator[int] = field(default_factory=lambda: itertools.cycle([0, 1, 2]))

    def call(self, case: schemathesis.Case, caller: Caller) -> None:
        how = next(self.aim)  # as generated, aimed, aimed with huge integers
        if case.path_parameters and how:
            for key in case.path_parameters.keys() & self.known.keys():
                case.path_parameters[key] = self.known[key]
        if how == 2:
            case.body = _huge(case.body)
            case.query = _huge(case.query)  # type: ignore[assignment]
        what = f"{caller.name}: {case.method} {case.formatted_path} query={case.query} "
        what += f"body={case.body!r:.300}"
        self.calls += 1
        self.reached.add((caller.name, case.operation.label))
        if case.path == LONG_POLL and isinstance(case.query, dict):
            wait = case.query.get("wait")  # the long poll holds up to its wait: keep it short
            if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 1:
                case.query["wait"] = 1
        request = case.as_transport_kwargs(headers=caller.headers)
        try:
            r = self.send(caller, request)
        except requests.RequestException as exc:  # the server dropped the connection twice
            self.failures.append(f"{what} -> {type(exc).__name__}: {exc}")
            return
        with r:
            if r.headers.get("content-type", "").startswith("text/event-stream"):
                text = ""  # a live stream: its status line says enough
            else:
                text = r.text
        caller.refused |= r.status_code == 401
        self.statuses[caller.name, r.status_code] += 1
        if r.status_code == 204 and case.path == "/runner/v1/session":
            caller.token = str(case.body["token"])  # type: ignore[index]
        if r.status_code >= 500:
            self.failures.append(f"{what} -> {r.status_code} {text[:200]}")

    @staticmethod
    def send(caller: Caller, request: dict[str, Any]) -> requests.Response:
        """One call; sent again on a new connection when the first one was dropped (uvicorn
        closes an idle kept-alive connection after 5 s, which races with reusing it)."""
        try:
            return caller.http.request(**request, stream=True, timeout=30)
        except requests.ConnectionError:
            caller.http.close()
            return caller.http.request(**request, stream=True, timeout=30)

    def operation(
        self, operation: schemathesis.APIOperation, caller: Caller, cases: int, deadline: float
    ) -> None:
        strategy = self.strategies.get(operation.label)
        if strategy is None:
            strategy = self.strategies[operation.label] = operation.as_strategy()

        @given(case=strategy)
        @settings(
            max_examples=cases,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def call(case: schemathesis.Case) -> None:
            if time.monotonic() < deadline:
                self.call(case, caller)

        with contextlib.suppress(Unsatisfiable):  # an operation no valid case fits
            call()
        caller.still_signed_in()


def test_no_generated_request_answers_5xx(server: Server) -> None:
    started = time.monotonic()
    ann = Caller(server.url, "ann", PASSWORD)
    ann.sign_in(register=True)
    admin = Caller(server.url, "admin", ADMIN_PASSWORD)
    admin.sign_in()
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    fuzz = Fuzz(_existing(ann))
    runner = RunnerCaller(server.url, "runner", _launch_secret(server, fuzz.known["ref"]))
    runner.sign_in()
    # the runner first: the users' generated calls may stop or release its instance
    pairs = [(runner, o) for o in operations if o.path.startswith("/runner/")]
    pairs += [(caller, operation) for caller in (ann, admin) for operation in operations]
    deadline = started + BUDGET_S
    for round_, cases in enumerate(ROUNDS):
        for caller, operation in pairs:
            if round_ == 0 or time.monotonic() < deadline:
                fuzz.operation(operation, caller, cases, math.inf if round_ == 0 else deadline)
    everything = {(caller.name, operation.label) for caller, operation in pairs}
    missed = sorted(everything - fuzz.reached)
    log = server.log.read_text(errors="replace")
    print(
        f"{fuzz.calls} calls on {len(operations)} operations in {time.monotonic() - started:.0f} s"
    )
    print(sorted(fuzz.statuses.items()))
    # each caller got past authentication: its calls reached the routes
    for caller in (ann, admin, runner):
        assert any(n == caller.name and status != 401 for n, status in fuzz.statuses), caller.name
    assert not fuzz.failures, f"{len(fuzz.failures)} answers >= 500:\n" + "\n".join(
        fuzz.failures[:40]
    )
    assert "Traceback" not in log, log[-6000:]
    assert not missed, f"{len(missed)} of {len(everything)} pairs never called: {missed[:20]}"
