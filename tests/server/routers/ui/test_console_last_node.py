"""The instance page says which node the instance last ran on, also while it is stopped."""

from __future__ import annotations

from collections.abc import Callable

from starlette.testclient import TestClient

from factories import BrowserFactory, Caller, RunnerDouble, logged_in, make_running_instance


def test_the_instance_page_names_the_node_it_last_ran_on(
    http: TestClient,
    ann: Caller,
    bob: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    browser: BrowserFactory,
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, "box")
    node = ann.get("/api/v1/instances/box").json()["node"]
    ann.post("/api/v1/instances/box/stop")
    tick()
    runner.stopped()
    page = logged_in(browser, "ann").get(f"/instances/{instance_id}")
    assert page.status_code == 200
    shown = page.text.split('data-testid="last-node"', 1)[1].split("</dd>", 1)[0]
    assert node and node in shown
    assert logged_in(browser, "bob").get(f"/instances/{instance_id}").status_code == 404
