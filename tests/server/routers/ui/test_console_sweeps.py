"""The console's sweeps: the list, a sweep's page with its trials, best trial and the chart
card that overlays every trial's curve, its live partial; another user's sweep is not found."""

from __future__ import annotations

import json
from collections.abc import Callable
from html import unescape

from factories import BrowserFactory, Caller, RunnerDouble, logged_in


def _sweep(ann: Caller) -> dict[str, object]:
    body = {
        "name": "tune",
        "task": {"name": "train", "run": "python train.py --lr ${lr}", "gpu": None},
        "space": {"grid": {"lr": ["0.1", "0.01"]}},
        "metric": "val_acc",
    }
    r = ann.post("/api/v1/sweeps", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_the_sweep_pages_show_trials_the_best_and_the_curves_card(
    ann: Caller,
    browser: BrowserFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    sweep = _sweep(ann)
    trials = sweep["trials"]
    assert isinstance(trials, list)
    tick()
    for trial, value in zip(trials, (0.7, 0.9), strict=True):
        runner = runner_for(trial["instance_id"])
        runner.ready()
        run_id = trial["run_id"]
        assert runner.call("POST", f"/runs/{run_id}/started", json={"pid": 2}).status_code == 204
        point = {"key": "val_acc", "step": 1, "value": value, "time": 1.7e9}
        r = runner.call("POST", f"/runs/{run_id}/metrics", json={"points": [point]})
        assert r.status_code == 204

    client = logged_in(browser, "ann")
    listing = client.get("/sweeps")
    assert listing.status_code == 200
    assert f'href="/sweeps/{sweep["id"]}"' in listing.text and "2 running" in listing.text
    assert 'href="/sweeps"' in client.get("/").text  # in the nav

    page = client.get(f"/sweeps/{sweep['id']}")
    assert page.status_code == 200
    text = page.text
    assert "Best by val_acc (max): <strong>trial 2</strong> (lr=0.01), 0.9" in text
    assert f'data-url="/api/v1/sweeps/{sweep["id"]}/curves?key=val_acc"' in text
    assert 'src="/static/js/sweep.js' in text and 'src="/static/js/charts.js' in text
    labels_attr = text.split('data-labels="', 1)[1].split('"', 1)[0]
    labels = json.loads(unescape(labels_attr))
    assert labels == {
        str(trials[0]["run_id"]): "trial 1 (lr=0.1)",
        str(trials[1]["run_id"]): "trial 2 (lr=0.01)",
    }
    partial = client.get(f"/partials/sweeps/{sweep['id']}")
    assert partial.status_code == 200 and 'id="sweep-trials" data-live' in partial.text


def test_bad_and_other_users_sweep_pages(ann: Caller, bob: Caller, browser: BrowserFactory) -> None:
    sweep = _sweep(ann)
    client = logged_in(browser, "bob")
    for url in (f"/sweeps/{sweep['id']}", "/sweeps/abc", "/sweeps/99999999"):
        page = client.get(url)
        assert page.status_code == 404, url
        assert "Sweep not found" in page.text
    assert client.get(f"/partials/sweeps/{sweep['id']}").status_code == 404
    assert "No sweeps yet" in client.get("/sweeps").text
    mine = logged_in(browser, "ann")
    bad = mine.get(f"/sweeps/{sweep['id']}", params={"metric": "val acc"})
    assert bad.status_code == 422 and "not a metric key" in bad.text
