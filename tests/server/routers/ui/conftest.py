"""Console fixtures: browsers of the in-process app, each with its own cookie jar."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from factories import BrowserFactory, console_client


@pytest.fixture
def browser(http: TestClient) -> Iterator[BrowserFactory]:
    """browser(base_url=...) -> a client of the same app with its own cookie jar that does
    not follow redirects, as a separate browser would be; closed after the test."""
    made: list[TestClient] = []

    def make(base_url: str = "http://testserver") -> TestClient:
        client = console_client(http.app, base_url)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()
