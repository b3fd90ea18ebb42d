"""Plain factory functions for tests: users, callers, instances."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.testclient import TestClient


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


def make_user(http: TestClient, name: str, password: str = "password-123") -> Caller:
    r = http.post("/api/v1/auth/register", json={"name": name, "password": password})
    assert r.status_code == 201, r.text
    return Caller(http, r.json()["token"], name)


def login_admin(http: TestClient) -> Caller:
    r = http.post("/api/v1/auth/login", json={"name": "admin", "password": "admin-password-1"})
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
