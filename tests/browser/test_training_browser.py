"""Training watched in a real browser: register, create an instance from the form, start the
digits example from the instance page, watch its loss curve grow, compare two runs.

This is about the browser, so it runs once, on SQLite: a real `gpulease server` process with
its real runner (bubblewrap sandbox, the `pytorch` template environment, cached under
.cache/envs like the e2e tests) training examples/digits with real PyTorch. The example's
`epoch=N loss=… acc=…` stdout lines become metric points through the runner's stdout parser;
the run page draws them with uPlot and grows the curve from the run's event stream (the
second run also reports through `track.log`, the SDK).
Screenshots of every page go to test-artifacts/browser/training-*.png.

The instance page's GPU charts need a real GPU's readings, so their test runs the app in
process on a host whose NVML (the discovery seam) reports one real H100, and posts readings
as its runner would.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from browser_support import BROWSER_MARKS, log_in, page_problems, serving, shot
from factories import RunnerDouble
from gpulease.backends.fake import FakeBackend
from gpulease.server.app import create_app
from gpulease.server.reconcilers.loop import run_once
from gpulease.server.runtime import build_runtime
from gpulease.server.settings import Settings
from processes import REPO, Platform, running_platform

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

PASSWORD = "cat-breeds-2024"
TRAIN = "python /data/digits/train.py --data /data/digits/data --save model.pt"
# The first run's metrics come from its stdout only (its track.log calls are no-ops without
# GPULEASE_METRICS_FILE), one line per 0.5 s at most: on a quick machine the training may
# end faster than the console refreshes, and the test is that points arrive while it runs.
PACED_TRAIN = f"env -u GPULEASE_METRICS_FILE {TRAIN}"
PACED = ' | while IFS= read -r line; do echo "$line"; sleep 0.5; done'
FIRST_EPOCHS = 4
SECOND_EPOCHS = 2
# Starting an instance builds the pytorch environment once per checkout (minutes); later
# starts reuse it.
START_TIMEOUT_MS = 600_000
RUN_TIMEOUT_MS = 180_000

pytestmark = BROWSER_MARKS

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    database_url = f"sqlite:///{tmp_path / 'gpulease.db'}"
    with running_platform(tmp_path, database_url, "A100-80GB:1,T4:1") as p:
        yield p


def digits_dataset(tmp_path: Path, data: Path) -> Path:
    """The example's script and its data (data: the session's digits_data, scikit-learn's
    digits as PNGs) in one directory."""
    folder = tmp_path / "digits"
    folder.mkdir()
    shutil.copy(REPO / "examples" / "digits" / "train.py", folder / "train.py")
    shutil.copytree(data, folder / "data")
    for i, image in enumerate(sorted((folder / "data").rglob("*.png"))):
        if i % 4:
            image.unlink()  # a quarter of the digits is enough to see the loss fall
    return folder


def loss_points(page: Page, chart: str = "run:loss") -> int:
    """Points drawn on a uPlot chart of the page (non-null y values of its first curve)."""
    return int(
        page.evaluate(
            """(name) => {
                const plot = (window.gpuleaseCharts || {})[name];
                return plot ? plot.data[1].filter((v) => v !== null && v !== undefined).length : 0;
            }""",
            chart,
        )
    )


def start_run(page: Page, command: str) -> int:
    # the instance page's scripts (terminal, charts) settle first: the form must not move
    # under the click
    page.wait_for_load_state("load")
    page.get_by_label("Command").fill(command)
    expect(page.get_by_label("Command")).to_have_value(command)
    page.get_by_role("button", name="Start run").click()
    expect(page).to_have_url(re.compile(r"/runs/\d+$"))
    match = re.search(r"/runs/(\d+)$", page.url)
    assert match is not None
    return int(match.group(1))


@pytest.mark.e2e
def test_train_in_the_console_and_watch_the_loss_curve_grow(
    platform: Platform, browser: Browser, tmp_path: Path, digits_data: Path
) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    problems = page_problems(page, console=lambda msg: msg.type == "error")
    url = platform.url

    # Register in the page; the digits go up as a dataset from the command line.
    page.goto(url + "/register")
    page.get_by_label("User name").fill("carol")
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Repeat the password").fill(PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page).to_have_url(url + "/")
    platform.cli("login", "--server", url, "--name", "carol", "--password", PASSWORD)
    platform.cli("dataset", "push", str(digits_dataset(tmp_path, digits_data)), "--name", "digits")

    page.get_by_role("link", name="Catalog", exact=True).click()
    expect(page.locator('tr[data-model="A100-80GB"]')).to_contain_text("simulated")
    expect(page.get_by_test_id("free-A100-80GB")).to_contain_text("1 / 1")
    shot(page, "training-catalog.png")

    # Create an instance from the form, with the dataset mounted.
    page.get_by_role("link", name="Create", exact=True).click()
    page.locator("#gpu-model").select_option("A100-80GB")
    page.locator('#template input[value="pytorch"]').check()
    page.locator('#datasets input[value="digits"]').check()
    page.get_by_label("Name").fill("digits")
    expect(page.locator("#est-cost")).not_to_have_text("—")
    shot(page, "training-create.png")
    page.get_by_role("button", name="Create instance").click()
    expect(page).to_have_url(re.compile(r"/instances/\d+$"))
    status = page.get_by_test_id("instance-status")
    expect(status).to_have_text("running", timeout=START_TIMEOUT_MS)
    expect(page.locator("#gpus")).to_contain_text("simulated, no readings")

    # The first run: its loss curve gains points while it runs, without a reload.
    first = start_run(page, f"{PACED_TRAIN} --epochs {FIRST_EPOCHS}{PACED}")
    page.evaluate("window.__sameDocument = true")
    page.wait_for_function(
        "() => { const p = (window.gpuleaseCharts || {})['run:loss'];"
        " return p && p.data[1].length >= 1; }",
        timeout=RUN_TIMEOUT_MS,
    )
    early = loss_points(page)
    # fewer points than epochs: the curve is drawn while the run still goes on
    assert 1 <= early < FIRST_EPOCHS, f"{early} points on the chart at the first look"
    page.wait_for_function(
        "(n) => (window.gpuleaseCharts['run:loss'].data[1].length > n)",
        arg=early,
        timeout=RUN_TIMEOUT_MS,
    )
    later = loss_points(page)
    assert later > early
    expect(page.locator("#log-status")).to_have_text("succeeded", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#log-note")).to_have_text("Exited with code 0.")
    page.wait_for_function(
        "(n) => window.gpuleaseCharts['run:loss'].data[1].length === n",
        arg=FIRST_EPOCHS,
    )
    assert loss_points(page) == FIRST_EPOCHS
    losses = page.evaluate("window.gpuleaseCharts['run:loss'].data[1]")
    assert losses[-1] < losses[0], f"the loss did not go down: {losses}"
    for key in ("acc", "val_acc"):
        assert loss_points(page, f"run:{key}") == FIRST_EPOCHS, key
    expect(page.locator("#log-output")).to_contain_text(f"epoch={FIRST_EPOCHS} loss=")
    expect(page.get_by_test_id("run-exit")).to_have_text("0")
    assert page.evaluate("window.__sameDocument") is True, "the run page reloaded"
    shot(page, "training-run.png")

    # A second run with another learning rate, then both overlaid.
    page.get_by_role("link", name="digits", exact=True).first.click()
    expect(page).to_have_url(re.compile(r"/instances/\d+$"))
    second = start_run(page, f"{TRAIN} --epochs {SECOND_EPOCHS} --lr 0.01")
    expect(page.locator("#log-status")).to_have_text("succeeded", timeout=RUN_TIMEOUT_MS)
    page.get_by_test_id("compare-link").click()
    expect(page).to_have_url(url + f"/runs/compare?ids={second}")
    page.locator(f'#picker input[value="{first}"]').check()
    page.get_by_role("button", name="Compare").click()
    expect(page).to_have_url(
        re.compile(rf"/runs/compare\?ids=({first},{second}|{second},{first})$")
    )
    page.wait_for_function(
        "() => { const p = (window.gpuleaseCharts || {})['compare:loss'];"
        " return p && p.data.length === 3 && p.data[0].length > 0; }"
    )
    curves = page.evaluate(
        "window.gpuleaseCharts['compare:loss'].data.slice(1)"
        ".map((ys) => ys.filter((v) => v !== null).length)"
    )
    assert sorted(curves) == [SECOND_EPOCHS, FIRST_EPOCHS]
    expect(page.locator("#compare-legend")).to_contain_text(f"#{first}")
    shot(page, "training-compare.png")

    page.locator(f'#compare-legend a[data-run="{first}"]').click()
    page.get_by_role("link", name="digits").first.click()
    expect(page.locator("#instance-runs tr[data-run-id]")).to_have_count(2)
    shot(page, "training-instance.png")
    page.get_by_role("link", name="Dashboard", exact=True).first.click()
    expect(page.locator("#runs tr[data-run-id]")).to_have_count(2)
    expect(page.locator("#log-status")).to_have_text("succeeded")
    shot(page, "training-dashboard.png")
    context.close()
    assert problems == [], "\n".join(problems)


class OneRealH100:
    """NVML of a host with one real H100 (for discover()): GPU charts need a real GPU."""

    class NVMLError(Exception):
        pass

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return index

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return "GPU-h100-0"

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return SimpleNamespace(total=81559 * 1024 * 1024, used=0, free=81559 * 1024 * 1024)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.82.07"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 13000


def test_gpu_charts_draw_the_readings_and_grow_live(tmp_path: Path, browser: Browser) -> None:
    """In-process server on a fake backend whose host has one real H100 (through the NVML
    seam); the test plays the runner and posts its GPU readings. The page is opened while
    the instance is still queued: its GPU card and charts come with the page's live
    updates once it holds the GPU, without a reload."""
    settings = Settings(home=tmp_path / "home", simulated_gpus="", admin_password="admin-pw-12")
    backend = FakeBackend()
    rt = build_runtime(settings, backend, nvml=OneRealH100())  # type: ignore[arg-type]
    app = create_app(settings, runtime=rt, reconcilers=False)
    try:
        with serving(app) as url, httpx.Client(base_url=url) as http:
            r = http.post("/api/v1/auth/register", json={"name": "ann", "password": PASSWORD})
            token = {"Authorization": f"Bearer {r.json()['token']}"}
            r = http.post(
                "/api/v1/instances",
                json={"gpu": "H100-80GB:1", "template": "python", "name": "real"},
                headers=token,
            )
            assert r.status_code == 201, r.text
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            page = context.new_page()
            problems = page_problems(page)
            log_in(page, url, "ann", PASSWORD)
            page.goto(url + "/instances/real")
            expect(page.locator("#gpus")).to_contain_text("No GPUs held right now")
            page.evaluate("window.__sameDocument = true")

            run_once(rt)
            handle = backend.handle_for(r.json()["id"])
            assert handle is not None
            runner = RunnerDouble(http, backend.runners[handle].spec.token)  # type: ignore[arg-type]
            runner.ready()

            def reading(seconds_ago: float, util: float) -> None:
                sample = {
                    "uuid": "GPU-h100-0",
                    "time": time.time() - seconds_ago,
                    "util_pct": util,
                    "memory_used_mb": 1200,
                    "memory_total_mb": 81559,
                    "power_w": 250.0,
                    "temperature_c": 61.0,
                }
                r = runner.call("POST", "/gpu-samples", json={"samples": [sample]})
                assert r.status_code == 204, r.text

            reading(20, 10.0)
            reading(10, 55.0)
            chart = "gpu:GPU-h100-0:util_pct"
            count = f"(window.gpuleaseCharts['{chart}'] || {{data: [[]]}}).data[0].length"
            page.wait_for_function(f"() => {count} === 2")
            page.evaluate("document.getElementById('gpus').dataset.drawn = 'once'")
            reading(0, 93.0)  # a new reading arrives over the GPU event stream
            page.wait_for_function(f"() => {count} === 3")
            # later live updates keep the card (and its charts) while it holds the same GPU
            page.evaluate(
                "() => new Promise((done) =>"
                " document.addEventListener('live:updated', done, {once: true}))"
            )
            assert page.evaluate("document.getElementById('gpus').dataset.drawn") == "once"
            assert page.evaluate("window.__sameDocument") is True, "the instance page reloaded"
            assert page.evaluate(f"window.gpuleaseCharts['{chart}'].data[1]") == [10, 55, 93]
            for metric in ("memory_used_mb", "power_w", "temperature_c"):
                name = f"gpu:GPU-h100-0:{metric}"
                assert page.evaluate(f"window.gpuleaseCharts['{name}'].data[0].length") == 3
            expect(page.locator("[data-gpu-waiting]")).to_be_hidden()
            shot(page, "training-instance-gpu.png")
            context.close()
            assert problems == []
    finally:
        rt.engine.dispose()
