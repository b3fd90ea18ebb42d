"""Console pages over HTTP: catalog, create form, instance, run and compare pages.

Each page renders for its owner, is a 404 for anyone else, and answers bad input with a 4xx
page that says what to do. Runs on SQLite and PostgreSQL (the `database_url` fixture).
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.testclient import TestClient

from factories import Caller, RunnerDouble, console_client, make_running_instance
from gpulease.gpus.discovery import discover
from gpulease.server.db import transaction
from gpulease.server.runtime import Runtime
from gpulease.server.services import nodes

ClientFactory = Callable[[str], TestClient]
PASSWORD = "password-123"
SAME_ORIGIN = {"Origin": "http://testserver"}


@pytest.fixture
def logged_in(http: TestClient, database_url: str) -> Iterator[ClientFactory]:
    """logged_in(name) -> a client of the app with that user's session cookie that does not
    follow redirects, as that user's own browser would be."""
    made: list[TestClient] = []

    def make(name: str) -> TestClient:
        client = console_client(http.app)
        made.append(client)
        r = client.post("/login", data={"name": name, "password": PASSWORD})
        assert r.status_code == 303, r.text
        return client

    yield make
    for client in made:
        client.close()


def finished_run(
    owner: Caller, runner: RunnerDouble, instance: str, losses: list[float], key: str = "loss"
) -> int:
    r = owner.post(f"/api/v1/instances/{instance}/runs", json={"command": "python train.py"})
    assert r.status_code == 201, r.text
    run_id = int(r.json()["id"])
    assert runner.call("POST", f"/runs/{run_id}/started", json={"pid": 3}).status_code == 204
    points = [
        {"key": key, "step": i, "value": v, "time": time.time(), "source": "sdk"}
        for i, v in enumerate(losses)
    ]
    r = runner.call("POST", f"/runs/{run_id}/metrics", json={"points": points})
    assert r.status_code == 204, r.text
    assert runner.call("POST", f"/runs/{run_id}/exit", json={"exit_code": 0}).status_code == 204
    return run_id


def test_nav_lists_every_area_and_admin_only_for_admins(
    ann: Caller, admin: Caller, logged_in: ClientFactory
) -> None:
    html = logged_in("ann").get("/catalog").text
    nav = re.search(r'<nav class="nav".*?</nav>', html, re.S)
    assert nav is not None
    for href in ("/", "/catalog", "/instances/new", "/datasets", "/billing", "/support"):
        assert f'href="{href}"' in nav.group(0)
    assert 'href="/admin"' not in nav.group(0)
    assert 'href="/catalog" class="active"' in html
    admin_client = console_client(ann.http.app)
    r = admin_client.post("/login", data={"name": "admin", "password": "admin-password-1"})
    assert r.status_code == 303
    assert 'href="/admin"' in admin_client.get("/catalog").text
    admin_client.close()


def test_catalog_shows_prices_free_total_and_simulated_marks(
    ann: Caller,
    logged_in: ClientFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    make_running_instance(ann, tick, runner_for, "cats")
    client = logged_in("ann")
    page = client.get("/catalog")
    assert page.status_code == 200
    row = re.search(r'<tr data-model="A100-80GB">.*?</tr>', page.text, re.S)
    assert row is not None
    assert "1 / 2" in row.group(0)  # one of the two simulated A100s is taken by cats
    assert "simulated" in row.group(0)
    assert "$0.9000/h" in row.group(0)  # the on-demand price of pricing.yaml
    assert re.search(r'<tr data-model="T4">.*?0 / 0|1 / 1', page.text, re.S)
    assert "no off-peak windows" in page.text
    assert console_client(ann.http.app).get("/catalog").status_code == 303


class OldDriverH100s:
    """NVML of a host with two real H100s on driver 535 (CUDA 12.2), for discover()."""

    class NVMLError(Exception):
        pass

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return index

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return f"GPU-h100-{handle}"

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return SimpleNamespace(total=81559 * 1024 * 1024, used=0, free=81559 * 1024 * 1024)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "535.104.05"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12020


def test_templates_a_model_cannot_run_are_marked_with_the_reason(
    ann: Caller,
    rt: Runtime,
    logged_in: ClientFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    with transaction(rt.sessions) as session:
        inventory = discover(rt.catalog, nvml=OldDriverH100s())  # type: ignore[arg-type]
        nodes.register_node(session, "old-h100", "local", inventory)
    client = logged_in("ann")
    catalog = client.get("/catalog").text
    row = re.search(r'<tr data-model="H100-80GB">.*?</tr>', catalog, re.S)
    assert row is not None and "2 / 2" in row.group(0)
    refused = re.search(
        r'class="fit fit-no" data-template="pytorch-cu130" title="([^"]*)"', row.group(0)
    )
    assert refused is not None and "driver" in html.unescape(refused.group(1))
    assert 'class="fit fit-ok" data-template="pytorch-cu126"' in row.group(0)

    form = client.get("/instances/new").text
    option = re.search(r'<option value="H100-80GB"[^>]*>', form)
    assert option is not None
    assert 'data-refused-pytorch-cu130="' in option.group(0)
    assert "data-refused-pytorch-cu126" not in option.group(0)
    # the service refuses it too, and the form says why
    r = client.post(
        "/instances/new",
        data={"gpu_model": "H100-80GB", "gpu_count": "1", "template": "pytorch-cu130"},
    )
    assert r.status_code == 409 and "cannot run on any H100-80GB node" in r.text

    # an instance on those real GPUs gets a chart box per reading, fed by the GPU API
    made = ann.post(
        "/api/v1/instances",
        json={"gpu": "H100-80GB:1", "template": "pytorch-cu126", "name": "real"},
    )
    assert made.status_code == 201, made.text
    tick()
    runner_for(made.json()["id"]).ready()
    page = client.get("/instances/real").text
    card = re.search(
        r'<div class="gpu-card" data-gpu-uuid="(GPU-h100-\d)" data-simulated="no">', page
    )
    assert card is not None
    for metric in ("util_pct", "memory_used_mb", "power_w", "temperature_c"):
        assert f'data-gpu-metric="{metric}"' in page
    assert "simulated, no readings" not in page
    gpus = ann.get("/api/v1/instances/real/gpus").json()
    assert [g["uuid"] for g in gpus["gpus"] if g["held"]] == [card.group(1)]


def test_create_form_offers_plans_teams_and_datasets_and_mounts_them(
    ann: Caller, bob: Caller, logged_in: ClientFactory
) -> None:
    client = logged_in("ann")
    r = client.post(
        "/datasets",
        data={"name": "cats"},
        files=[("files", ("a.txt", b"meow"))],
        headers=SAME_ORIGIN,
    )
    assert r.status_code == 303, r.text
    assert ann.post("/api/v1/teams", json={"name": "lab"}).status_code in (200, 201)
    form = client.get("/instances/new").text
    for value in ("on_demand", "daily", "spot"):
        assert f'<option value="{value}"' in form
    assert '<option value="lab">team lab</option>' in form
    assert '<input type="checkbox" name="datasets" value="cats">' in form
    assert '<option value="CPU"' in form

    fields = {"gpu_model": "T4", "gpu_count": "1", "template": "python", "name": "spotty"}
    r = client.post(
        "/instances/new",
        data={**fields, "plan": "spot", "datasets": ["cats"]},
        headers=SAME_ORIGIN,
    )
    assert r.status_code == 303, r.text
    (made,) = [i for i in ann.get("/api/v1/instances").json() if i["name"] == "spotty"]
    assert made["plan"] == "spot" and made["team"] is None and made["datasets"] == {"cats": 1}
    # the team goes to the service too: its wallet is empty, so the form says so
    r = client.post("/instances/new", data={**fields, "name": "labby", "team": "lab"})
    assert r.status_code == 402 and "lab" in r.text
    assert '<option value="lab" selected>team lab</option>' in r.text

    # refusals come back on the form with what was typed
    r = client.post("/instances/new", data={**fields, "name": "renew", "auto_renew": "yes"})
    assert r.status_code == 422 and "auto-renew applies to the daily plan only" in r.text
    assert 'name="auto_renew" value="yes" checked' in r.text
    r = client.post("/instances/new", data={**fields, "name": "x", "plan": "weekly"})
    assert r.status_code == 422 and "unknown plan &#39;weekly&#39;" in r.text
    bobs = logged_in("bob")
    r = bobs.post("/instances/new", data={**fields, "name": "thief", "datasets": ["cats"]})
    assert r.status_code == 404 and "cats" in r.text
    assert [i["name"] for i in bob.get("/api/v1/instances").json()] == []


def test_instance_page_for_its_owner_and_404_for_anyone_else(
    ann: Caller,
    bob: Caller,
    logged_in: ClientFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, "cats")
    run_id = finished_run(ann, runner, "cats", [0.9, 0.5])
    client = logged_in("ann")
    for ref in (str(instance_id), "cats"):
        page = client.get(f"/instances/{ref}")
        assert page.status_code == 200, page.text
        assert "<h1>cats</h1>" in page.text
        assert 'data-testid="instance-status"><span class="pill pill-running"' in page.text
        assert f'href="/runs/{run_id}"' in page.text
        assert "simulated, no readings" in page.text
        assert 'action="/instances/' in page.text and "/stop" in page.text
    live = client.get(f"/partials/instances/{instance_id}")
    assert live.status_code == 200 and 'id="instance-status" data-live' in live.text
    # the GPU card too, keyed by the GPUs it holds (live.js swaps it in when they change)
    assert 'id="gpus" data-live data-live-key="1:' in live.text
    assert "simulated, no readings" in live.text

    bobs = logged_in("bob")
    for url in (
        f"/instances/{instance_id}",
        "/instances/cats",
        f"/partials/instances/{instance_id}",
    ):
        r = bobs.get(url)
        assert r.status_code == 404, url
        assert "python train.py" not in r.text
    r = client.get("/instances/nope")
    assert r.status_code == 404 and "you have no instance &#39;nope&#39;" in r.text
    assert client.get("/instances/" + "x" * 300).status_code == 404


def test_stop_start_release_buttons_go_through_the_services(
    ann: Caller,
    bob: Caller,
    logged_in: ClientFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, "cats")
    client = logged_in("ann")
    bobs = logged_in("bob")

    # someone else's buttons do nothing
    for action in ("stop", "release", "start"):
        r = bobs.post(f"/instances/{instance_id}/{action}", headers=SAME_ORIGIN)
        assert r.status_code == 404
    assert ann.get(f"/api/v1/instances/{instance_id}").json()["status"] == "running"
    # a post from another site is refused
    r = client.post(f"/instances/{instance_id}/stop", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    assert ann.get(f"/api/v1/instances/{instance_id}").json()["status"] == "running"

    r = client.post(f"/instances/{instance_id}/stop", headers=SAME_ORIGIN)
    assert r.status_code == 303 and r.headers["location"] == f"/instances/{instance_id}"
    assert ann.get(f"/api/v1/instances/{instance_id}").json()["status"] == "stopping"
    # starting a stopping instance is refused on the page, with what to do
    r = client.post(f"/instances/{instance_id}/start", headers=SAME_ORIGIN)
    assert r.status_code == 409 and "still stopping" in r.text
    runner.heartbeat()
    assert runner.call("POST", "/stopped", json={}).status_code in (200, 204)
    tick()
    status = ann.get(f"/api/v1/instances/{instance_id}").json()["status"]
    assert status == "stopped", status
    page = client.get(f"/instances/{instance_id}").text
    assert f'action="/instances/{instance_id}/start"' in page
    assert f'action="/instances/{instance_id}/stop"' not in page
    r = client.post(f"/instances/{instance_id}/release", headers=SAME_ORIGIN)
    assert r.status_code == 303
    assert ann.get(f"/api/v1/instances/{instance_id}").json()["status"] == "released"


def test_start_a_run_from_the_instance_page(
    ann: Caller,
    bob: Caller,
    logged_in: ClientFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, "cats")
    client = logged_in("ann")
    r = client.post(
        f"/instances/{instance_id}/runs", data={"command": "echo hi"}, headers=SAME_ORIGIN
    )
    assert r.status_code == 303
    match = re.fullmatch(r"/runs/(\d+)", r.headers["location"])
    assert match is not None
    assert [c["id"] for c in runner.commands()] == [int(match.group(1))]
    # the box takes a script of several lines, run as typed
    script = "pip list\r\npython train.py --epochs 2"
    r = client.post(f"/instances/{instance_id}/runs", data={"command": script}, headers=SAME_ORIGIN)
    assert r.status_code == 303
    multi = ann.get("/api/v1" + r.headers["location"]).json()
    assert multi["command"] == "pip list\npython train.py --epochs 2"
    r = client.post(f"/instances/{instance_id}/runs", data={"command": "  "}, headers=SAME_ORIGIN)
    assert r.status_code == 422 and "the command is empty" in r.text
    r = logged_in("bob").post(
        f"/instances/{instance_id}/runs", data={"command": "rm -rf /"}, headers=SAME_ORIGIN
    )
    assert r.status_code == 404
    assert len(ann.get("/api/v1/runs").json()) == 2


def test_run_page_for_its_owner_and_404_for_anyone_else(
    ann: Caller,
    bob: Caller,
    logged_in: ClientFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    _, runner = make_running_instance(ann, tick, runner_for, "cats")
    run_id = finished_run(ann, runner, "cats", [0.9, 0.5, 0.3])
    client = logged_in("ann")
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200
    assert f"<h1>Run #{run_id}</h1>" in page.text
    assert 'data-keys="loss"' in page.text
    assert 'data-testid="run-exit">0<' in page.text
    assert f'href="/runs/compare?ids={run_id}"' in page.text
    assert "vendor/uplot/uPlot.iife.min.js" in page.text
    assert client.get(f"/partials/runs/{run_id}").status_code == 200

    bobs = logged_in("bob")
    for url in (f"/runs/{run_id}", f"/partials/runs/{run_id}"):
        r = bobs.get(url)
        assert r.status_code == 404 and "python train.py" not in r.text
    # the APIs the page reads refuse bob too
    for url in (f"/api/v1/runs/{run_id}/metrics", f"/api/v1/runs/{run_id}/stream"):
        assert bob.get(url).status_code == 404
    r = client.get("/runs/abc")
    assert r.status_code == 404 and "run ids are numbers" in r.text
    assert client.get("/runs/999999").status_code == 404


def test_compare_page_overlays_the_users_runs_only(
    ann: Caller,
    bob: Caller,
    logged_in: ClientFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    _, runner = make_running_instance(ann, tick, runner_for, "cats")
    first = finished_run(ann, runner, "cats", [0.9, 0.5])
    second = finished_run(ann, runner, "cats", [0.8, 0.4, 0.2])
    client = logged_in("ann")
    page = client.get(f"/runs/compare?ids={first},{second}")
    assert page.status_code == 200
    assert f'data-ids="{first},{second}"' in page.text and 'data-keys="loss"' in page.text
    assert page.text.count('type="checkbox" name="ids"') == 2
    assert page.text.count("checked") == 2
    # the picker's own form sends ids=1&ids=2
    page = client.get(f"/runs/compare?ids={first}&ids={second}")
    assert f'data-ids="{first},{second}"' in page.text
    assert client.get("/runs/compare").status_code == 200  # nothing chosen yet: the picker

    r = client.get(f"/runs/compare?ids={first},x")
    assert r.status_code == 422 and "is not a run id" in r.text
    r = client.get("/runs/compare?ids=" + ",".join(str(i) for i in range(1, 12)))
    assert r.status_code == 422 and "at most" in r.text

    bobs = logged_in("bob")
    r = bobs.get(f"/runs/compare?ids={first}")
    assert r.status_code == 404 and "python train.py" not in r.text
    assert bobs.get("/runs/compare").text.count('name="ids"') == 0
    assert bob.get(f"/api/v1/runs/compare?ids={first}&key=loss").status_code == 404


def test_dashboard_links_to_the_instance_and_run_pages(
    ann: Caller,
    logged_in: ClientFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, "cats")
    run_id = finished_run(ann, runner, "cats", [0.5])
    html = logged_in("ann").get("/").text
    assert f'href="/instances/{instance_id}"' in html
    assert f'href="/runs/{run_id}"' in html
    assert 'href="/catalog"' in html and 'href="/instances/new"' in html
