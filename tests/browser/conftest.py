"""Browser fixtures: Chromium through Playwright, and the app served in process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from browser_support import ADMIN_PASSWORD, CHROMIUM, CHROMIUM_ARGS, LiveServer, serving
from gpulease.backends.fake import FakeBackend
from gpulease.server.app import create_app
from gpulease.server.runtime import build_runtime
from gpulease.server.settings import Settings

if TYPE_CHECKING:
    from playwright.sync_api import Browser


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    """The real app under uvicorn on 127.0.0.1, reconcilers off: the test ticks them."""
    settings = Settings(
        home=tmp_path / "home", simulated_gpus="A100-80GB:2", admin_password=ADMIN_PASSWORD
    )
    backend = FakeBackend()
    rt = build_runtime(settings, backend)
    app = create_app(settings, runtime=rt, reconcilers=False)
    try:
        with serving(app) as url:
            yield LiveServer(url, rt, backend)
    finally:
        rt.engine.dispose()


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Headless Chromium (the test modules skip themselves without Playwright)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield chromium
        finally:
            chromium.close()
