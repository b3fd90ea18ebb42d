"""The console's instance page: a queued instance's place, reason, estimated start and what
the estimate rests on, as the scheduler last wrote them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from factories import BrowserFactory, Caller, logged_in


def test_a_queued_instance_page_says_why_and_until_when(
    ann: Caller, bob: Caller, browser: BrowserFactory, tick: Callable[[], None]
) -> None:
    r = ann.post(
        "/api/v1/instances",
        json={"gpu": "A100-80GB:2", "name": "first", "max_runtime_minutes": 120},
    )
    assert r.status_code == 201, r.text
    tick()
    # nothing queued: the declared duration shows all the same, as it is now
    assert ann.get("/api/v1/instances/first").json()["duration_basis"] == "declared 2 h"
    r = ann.put("/api/v1/instances/first/autostop", json={"max_runtime_minutes": 90})
    assert r.status_code == 200, r.text
    assert ann.get("/api/v1/instances/first").json()["duration_basis"] == "declared 1 h 30 min"
    r = ann.put("/api/v1/instances/first/autostop", json={"max_runtime_minutes": 120})
    assert r.status_code == 200, r.text
    r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:2", "name": "second"})
    assert r.status_code == 201, r.text
    tick()
    second = ann.get("/api/v1/instances/second").json()
    assert second["status"] == "queued" and second["queue_eta"], second
    page = logged_in(browser, "ann").get("/instances/second")
    assert page.status_code == 200, page.text
    text = page.text
    assert 'data-testid="queue"' in text and "Waiting because" in text
    assert "needs 2 × A100-80GB on one node; the largest free block is 0" in text
    eta = datetime.fromisoformat(second["queue_eta"])
    assert f"{eta:%Y-%m-%d %H:%M:%S} UTC</time>" in text
    assert "expected ends of 1 of the 1 instance holding A100-80GB (1 declared)" in text
    assert 'data-testid="duration-basis"' in text and "no duration known" in text
    first = logged_in(browser, "ann").get("/instances/first").text
    assert 'data-testid="queue"' not in first and "declared 2 h" in first
    # another user reaches neither the page nor its reasons
    assert logged_in(browser, "bob").get(f"/instances/{second['id']}").status_code == 404
