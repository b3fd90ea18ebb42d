"""The admin console in a real browser: the GPU heat map on the nodes page, a credit grant."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from sqlalchemy import select

from browser_support import (
    ADMIN_PASSWORD,
    BROWSER_MARKS,
    LiveServer,
    error_but_422,
    log_in,
    page_problems,
    running_instance,
    shot,
)
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Gpu, Node
from gpulease.server.services import metrics

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = BROWSER_MARKS
sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

READ, QUIET = "GPU-real-read-0", "GPU-real-quiet-1"


def _real_gpus_with_an_hour_of_readings(server: LiveServer) -> None:
    """Two real GPUs beside the simulated ones: one read every minute for the past hour
    (utilisation climbing 0 → 98 %), one never read yet."""
    now = utcnow().timestamp()
    with transaction(server.rt.sessions) as session:
        node = session.scalars(select(Node)).one()
        for index, uuid in ((5, READ), (6, QUIET)):
            session.add(
                Gpu(
                    node_id=node.id,
                    index=index,
                    uuid=uuid,
                    nvml_name="NVIDIA A100-SXM4-80GB",
                    model="A100-80GB",
                    memory_mb=81920,
                    simulated=False,
                )
            )
        session.flush()
        readings = [
            metrics.GpuReadingIn(
                uuid=READ, time=now - 60 * m - 1, util_pct=float(98 - 98 * m // 59)
            )
            for m in reversed(range(60))  # oldest first, as a sampler sends them
        ]
        metrics.ingest_node_readings(session, node.id, readings)


def test_admin_sees_the_heat_map_and_grants_credit(server: LiveServer, browser: Browser) -> None:
    running_instance(server, "dora", "cats")
    _real_gpus_with_an_hour_of_readings(server)

    page = browser.new_context(viewport={"width": 1280, "height": 1000}).new_page()
    problems = page_problems(page, console=error_but_422)
    log_in(page, server.url, "admin", ADMIN_PASSWORD, next_path="/admin")
    expect(page).to_have_url(server.url + "/admin")

    heatmap = page.get_by_test_id("heatmap")
    real = heatmap.locator(f'g.heat-row[data-uuid="{READ}"]')
    expect(real.locator("rect.heat-cell:not(.heat-empty)")).to_have_count(60)
    expect(real.locator("text.heat-now")).to_have_text("98 %")
    simulated = heatmap.locator('g.heat-row[data-simulated="true"]')
    expect(simulated).to_have_count(2)
    expect(simulated.first).to_contain_text("simulated, no readings")
    assert simulated.locator("rect.heat-cell").count() == 0  # no invented numbers
    quiet = heatmap.locator(f'g.heat-row[data-uuid="{QUIET}"]')
    expect(quiet.locator("text.heat-now")).to_have_text("—")
    gpus = page.get_by_test_id("gpus-" + server.rt.node_name)
    expect(gpus).to_contain_text("dora/cats")
    expect(gpus.locator("tr", has_text=READ)).to_contain_text("98 %")
    expect(gpus.locator("tr", has_text=QUIET)).to_contain_text("none in the last 5 min")
    shot(page, "admin-nodes.png")

    # A reading arrives; the map redraws it without a reload (a refresh is also what the
    # page does when its tab becomes visible again).
    with transaction(server.rt.sessions) as session:
        node_id = session.scalars(select(Node.id)).one()
        fresh = metrics.GpuReadingIn(uuid=QUIET, time=utcnow().timestamp(), util_pct=42.0)
        metrics.ingest_node_readings(session, node_id, [fresh])
    page.evaluate("window.__sameDocument = true")
    page.evaluate("document.dispatchEvent(new Event('visibilitychange'))")
    expect(quiet.locator("text.heat-now")).to_have_text("42 %")
    assert page.evaluate("window.__sameDocument") is True

    page.get_by_role("link", name="Users").click()
    expect(page).to_have_url(server.url + "/admin/users")
    expect(page.get_by_test_id("balance-dora")).to_contain_text("$10.0000")
    page.get_by_label("User", exact=True).select_option("dora")
    page.get_by_label("Amount").fill("lots")
    page.get_by_role("button", name="Grant").click()
    expect(page.get_by_role("alert")).to_contain_text("'lots' is not an amount")
    page.get_by_label("Amount").fill("25")
    page.get_by_label("Memo").fill("competition credit")
    page.get_by_role("button", name="Grant").click()
    expect(page.get_by_role("status")).to_have_text("Granted $25.0000 to dora.")
    expect(page.get_by_test_id("balance-dora")).to_contain_text("$35.0000")
    shot(page, "admin-users.png")

    page.get_by_role("link", name="Prices").click()
    expect(page.get_by_test_id("price-table")).to_contain_text("A100-80GB")
    expect(page.get_by_test_id("pricing-file")).to_contain_text("pricing.yaml")
    shot(page, "admin-prices.png")
    assert problems == []
