"""Every response says nosniff; HSTS only when served over TLS."""

from __future__ import annotations

from starlette.testclient import TestClient


def test_static_files_and_api_answers_say_nosniff(http: TestClient) -> None:
    for path in ("/static/console.css", "/healthz", "/api/v1/me"):
        r = http.get(path)
        assert r.headers["x-content-type-options"] == "nosniff", path
        assert "strict-transport-security" not in r.headers, path


def test_hsts_is_sent_over_tls_only(http: TestClient) -> None:
    with TestClient(http.app, base_url="https://gpu.example") as tls:
        for path in ("/static/console.css", "/healthz", "/login"):
            r = tls.get(path)
            assert r.headers["strict-transport-security"] == "max-age=31536000", path
            assert r.headers["x-content-type-options"] == "nosniff", path
