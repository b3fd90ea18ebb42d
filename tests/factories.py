"""Plain factory functions for tests: users, callers, running instances, console clients."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Gpu, Node
from gpulease.server.runtime import Runtime
from gpulease.server.settings import Settings

ADMIN_PASSWORD = "admin-password-1"  # the tests' Settings(admin_password=...)
PASSWORD = "password-123"  # make_user's default

# browser() -> a client of the app with its own cookie jar that does not follow redirects
BrowserFactory = Callable[..., TestClient]


def console_client(app: Any, base_url: str = "http://testserver", **options: Any) -> TestClient:
    """A browser of the console: its own cookie jar, redirects not followed, and the Referer
    a browser sends on the console's own forms (a cookie's state change that has neither
    Origin nor Referer is refused). A test's own Origin or Referer header wins."""
    headers = {"Referer": f"{base_url}/"}
    return TestClient(app, base_url=base_url, follow_redirects=False, headers=headers, **options)


def make_settings(home: Path, database_url: str, **overrides: object) -> Settings:
    """The tests' server settings: simulated GPUs (A100-80GB:2,T4:1 unless overridden), a
    known admin password, $10 of sign-up credit; overrides: any other Settings field."""
    fields: dict[str, object] = {
        "simulated_gpus": "A100-80GB:2,T4:1",
        "admin_password": ADMIN_PASSWORD,
        "signup_credit": "10.00",
        **overrides,
    }
    return Settings(home=home, database_url=database_url, **fields)  # type: ignore[arg-type]


@dataclass
class Caller:
    """An HTTP client that always sends one user's token."""

    http: TestClient
    token: str
    name: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def get(self, url: str, **kw: object):  # type: ignore[no-untyped-def]
        return self.http.get(url, headers=self.headers, **kw)  # type: ignore[arg-type]

    def post(self, url: str, **kw: object):  # type: ignore[no-untyped-def]
        return self.http.post(url, headers=self.headers, **kw)  # type: ignore[arg-type]

    def put(self, url: str, **kw: object):  # type: ignore[no-untyped-def]
        return self.http.put(url, headers=self.headers, **kw)  # type: ignore[arg-type]

    def delete(self, url: str, **kw: object):  # type: ignore[no-untyped-def]
        return self.http.delete(url, headers=self.headers, **kw)  # type: ignore[arg-type]


def make_user(http: TestClient, name: str, password: str = PASSWORD) -> Caller:
    r = http.post("/api/v1/auth/register", json={"name": name, "password": password})
    assert r.status_code == 201, r.text
    return Caller(http, r.json()["token"], name)


def login_admin(http: TestClient) -> Caller:
    r = http.post("/api/v1/auth/login", json={"name": "admin", "password": ADMIN_PASSWORD})
    assert r.status_code == 200, r.text
    return Caller(http, r.json()["token"], "admin")


@dataclass
class RunnerDouble:
    """Plays a runner over the real runner protocol, with the token the backend was given."""

    http: TestClient
    token: str

    def call(self, method: str, path: str, **kw: object):  # type: ignore[no-untyped-def]
        headers = {"Authorization": f"Bearer {self.token}"}
        return self.http.request(method, f"/runner/v1{path}", headers=headers, **kw)  # type: ignore[arg-type]

    def ready(self) -> None:
        r = self.call("POST", "/ready", json={"pid": 1})
        assert r.status_code == 204, r.text

    def heartbeat(self) -> str:
        r = self.call("POST", "/heartbeat", json={"running_runs": []})
        assert r.status_code == 200, r.text
        return str(r.json()["action"])

    def commands(self) -> list[dict[str, object]]:
        r = self.call("GET", "/commands", params={"wait": 0})
        assert r.status_code == 200, r.text
        return list(r.json()["runs"])

    def run(self, run_id: int, lines: list[str], exit_code: int) -> None:
        assert self.call("POST", f"/runs/{run_id}/started", json={"pid": 2}).status_code == 204
        chunks = [
            {"seq": i, "stream": "stdout", "data": line + "\n", "time": 1.0e9 + i}
            for i, line in enumerate(lines)
        ]
        assert self.call("POST", f"/runs/{run_id}/logs", json={"chunks": chunks}).status_code == 204
        assert (
            self.call("POST", f"/runs/{run_id}/exit", json={"exit_code": exit_code}).status_code
            == 204
        )

    def stopped(self) -> None:
        assert self.call("POST", "/stopped", json={}).status_code == 204


def make_running_instance(
    owner: Caller,
    tick: Callable[[], object],
    runner_for: Callable[[int], RunnerDouble],
    name: str | None = None,
    *,
    gpu: str | None = "A100-80GB:1",
    **body: object,
) -> tuple[int, RunnerDouble]:
    """Create an instance through the API, run the reconcilers once to place and launch it,
    and have its runner report ready. Returns its id and the double that plays its runner.
    body: any other field of the create request (plan, template, auto_release...)."""
    spec: dict[str, object] = {"gpu": gpu, **body}
    if name is not None:
        spec["name"] = name
    r = owner.post("/api/v1/instances", json=spec)
    assert r.status_code == 201, r.text
    instance_id = int(r.json()["id"])
    tick()
    runner = runner_for(instance_id)
    runner.ready()
    return instance_id, runner


def make_node(
    rt: Runtime, name: str, hostname: str, *, model: str = "A100-80GB", gpus: int = 2
) -> int:
    """A ready node of the fake backend with `gpus` simulated GPUs of `model`; its id."""
    with transaction(rt.sessions) as session:
        now = utcnow()
        node = Node(
            name=name,
            backend="fake",
            hostname=hostname,
            status="ready",
            registered_at=now,
            last_seen_at=now,
        )
        session.add(node)
        session.flush()
        for index in range(gpus):
            session.add(
                Gpu(
                    node_id=node.id,
                    index=index,
                    uuid=f"sim-{name}-{index}",
                    nvml_name=model,
                    model=model,
                    memory_mb=81920,
                    simulated=True,
                )
            )
        return node.id


def logged_in(browser: BrowserFactory, name: str, password: str = PASSWORD) -> TestClient:
    """A new console client with name's session cookie, as that user's own browser."""
    client = browser()
    r = client.post("/login", data={"name": name, "password": password})
    assert r.status_code == 303, r.text
    return client
