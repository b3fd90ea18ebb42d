"""The support and notification settings pages: render, open a ticket from a run page with
its log, an admin answers in the console, another user gets 404, forms refuse bad input."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from starlette.testclient import TestClient

from factories import Caller, RunnerDouble, console_client, make_running_instance

BrowserFactory = Callable[[], TestClient]


@pytest.fixture
def browser(http: TestClient) -> Iterator[Callable[[str], TestClient]]:
    """browser(name) -> a client of the app logged in as name, with its own cookies."""
    made: list[TestClient] = []

    def make(name: str) -> TestClient:
        client = console_client(http.app)
        made.append(client)
        password = "admin-password-1" if name == "admin" else "password-123"
        r = client.post("/login", data={"name": name, "password": password})
        assert r.status_code == 303, r.text
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def run_id(ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]) -> int:
    _, runner = make_running_instance(ann, tick, runner_for, "cats")
    run = ann.post("/api/v1/instances/cats/runs", json={"command": "python train.py"}).json()
    runner.run(run["id"], ["epoch 1 loss=0.9", "RuntimeError: <boom> & co"], exit_code=1)
    return int(run["id"])


def test_ticket_from_a_run_page_to_an_admin_answer(
    ann: Caller, admin: Caller, browser: Callable[[str], TestClient], run_id: int
) -> None:
    client = browser("ann")
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200
    assert f'href="/support/new?run={run_id}"' in page.text  # the partial on the run page
    form = client.get(f"/support/new?run={run_id}")
    assert form.status_code == 200 and "python train.py" in form.text
    assert 'name="attach_log"' in form.text
    r = client.post(
        "/support/new",
        data={"subject": "it broke", "body": "see the log", "run": str(run_id), "attach_log": "on"},
    )
    assert r.status_code == 303, r.text
    ticket_url = r.headers["location"]
    page = client.get(ticket_url)
    assert page.status_code == 200 and "it broke" in page.text
    assert "RuntimeError: &lt;boom&gt; &amp; co" in page.text  # the log, escaped
    assert "it broke" in client.get("/support").text

    support = browser("admin")
    listed = support.get("/support")
    assert "it broke" in listed.text and "ann" in listed.text
    r = support.post(f"{ticket_url}/reply", data={"body": "retry with --fp16"})
    assert r.status_code == 303
    assert "retry with --fp16" in client.get(ticket_url).text
    assert "pill-answered" in client.get(ticket_url).text
    assert any(n["kind"] == "ticket_reply" for n in ann.get("/api/v1/notifications").json())
    assert client.post(f"{ticket_url}/close").status_code == 303
    assert "pill-closed" in client.get(ticket_url).text


def test_instance_page_links_to_a_ticket_about_it(
    ann: Caller, browser: Callable[[str], TestClient], run_id: int
) -> None:
    client = browser("ann")
    instance_id = ann.get("/api/v1/instances/cats").json()["id"]
    page = client.get(f"/instances/{instance_id}")
    assert f'href="/support/new?instance={instance_id}"' in page.text
    form = client.get(f"/support/new?instance={instance_id}")
    assert form.status_code == 200 and "about instance cats" in form.text
    assert 'name="attach_log"' not in form.text


def test_other_users_tickets_and_runs_are_not_found(
    ann: Caller, bob: Caller, browser: Callable[[str], TestClient], run_id: int
) -> None:
    ticket = ann.post("/api/v1/support/tickets", json={"subject": "mine", "body": "b"}).json()
    client = browser("bob")
    for url in (
        f"/support/{ticket['id']}",
        f"/support/new?run={run_id}",
        "/support/new?instance=cats",
        "/support/abc",
    ):
        r = client.get(url)
        assert r.status_code == 404, url
        assert "mine" not in r.text and "python train.py" not in r.text
    assert client.post(f"/support/{ticket['id']}/reply", data={"body": "x"}).status_code == 404
    assert client.post(f"/support/{ticket['id']}/close").status_code == 404
    assert "mine" not in client.get("/support").text


def test_ticket_form_refusals_keep_what_was_typed(
    ann: Caller, browser: Callable[[str], TestClient]
) -> None:
    client = browser("ann")
    r = client.post("/support/new", data={"subject": "s", "body": "x" * 10_001})
    assert r.status_code == 422 and "keep it under 10,000" in r.text
    r = client.post("/support/new", data={"subject": "kept subject", "body": "  "})
    assert r.status_code == 422 and "the message is empty" in r.text and "kept subject" in r.text
    r = client.post(
        "/support/new",
        data={"subject": "s", "body": "b"},
        headers={"Origin": "https://evil.example"},
    )
    assert r.status_code == 403
    assert ann.get("/api/v1/support/tickets").json() == []


def test_notification_settings_page(ann: Caller, browser: Callable[[str], TestClient]) -> None:
    client = browser("ann")
    page = client.get("/settings/notifications")
    assert page.status_code == 200 and 'data-testid="no-smtp"' in page.text
    r = client.post("/settings/notifications/webhook", data={"url": "gopher://x"})
    assert r.status_code == 422 and "http:// or https://" in r.text and "gopher://x" in r.text
    r = client.post(
        "/settings/notifications/webhook",
        data={"url": "https://hooks.example.com/g", "enabled": "on", "kinds": ["runs", "support"]},
    )
    assert r.status_code == 200 and 'data-testid="webhook-secret"' in r.text
    secret = r.text.split('class="secret-once">')[1].split("<")[0]
    assert secret.startswith("whsec_")
    channels = ann.get("/api/v1/notifications/channels").json()
    assert channels["webhook"]["kinds"] == ["runs", "support"]
    page = client.get("/settings/notifications")
    assert secret not in page.text and secret[-4:] in page.text  # shown once, then a hint
    r = client.post("/settings/notifications/webhook/rotate")
    assert r.status_code == 200 and secret not in r.text and "whsec_" in r.text
    r = client.post("/settings/notifications/test")
    assert r.status_code == 303 and r.headers["location"].endswith("done=tested")
    assert "queued" in client.get(r.headers["location"]).text
    r = client.post(
        "/settings/notifications/email", data={"address": "ann@example.com", "enabled": "on"}
    )
    assert r.status_code == 409 and "GPULEASE_SMTP_HOST" in r.text
    r = client.post("/settings/notifications/webhook/remove")
    assert r.status_code == 303
    assert ann.get("/api/v1/notifications/channels").json()["webhook"] is None
    r = client.post(
        "/settings/notifications/webhook/rotate", headers={"Origin": "https://evil.example"}
    )
    assert r.status_code == 403


def test_pages_need_a_login(http: TestClient) -> None:
    client = console_client(http.app)
    for url in ("/support", "/support/new", "/support/1", "/settings/notifications"):
        r = client.get(url)
        assert r.status_code == 303 and r.headers["location"].startswith("/login"), url
    client.close()
