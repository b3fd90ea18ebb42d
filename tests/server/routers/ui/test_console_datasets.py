"""The console's datasets page: listing, uploading a small folder, removing, refusals."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from factories import Caller, console_client
from gpulease.server.routers.ui.datasets import dataset_paths
from gpulease.server.runtime import Runtime


@pytest.fixture
def browser(http: TestClient, ann: Caller) -> Iterator[TestClient]:
    client = console_client(http.app)
    r = client.post("/login", data={"name": "ann", "password": "password-123"})
    assert r.status_code == 303
    yield client
    client.close()


def _folder(*files: tuple[str, bytes]) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("files", (name, data, "application/octet-stream")) for name, data in files]


def test_upload_a_folder_list_and_remove(browser: TestClient, ann: Caller) -> None:
    page = browser.get("/datasets")
    assert page.status_code == 200 and "No datasets yet" in page.text
    assert 'href="/datasets"' in page.text and "webkitdirectory" in page.text
    r = browser.post(
        "/datasets",
        data={"name": ""},
        files=_folder(("cats/a/1.jpg", b"one"), ("cats/b/2.jpg", b"two"), ("cats/3.txt", b"")),
    )
    assert r.status_code == 303 and r.headers["location"] == "/datasets?pushed=cats"
    page = browser.get(r.headers["location"])
    assert "Uploaded cats" in page.text and 'data-dataset="cats"' in page.text
    detail = ann.get("/api/v1/datasets/cats").json()
    assert detail["dataset"]["file_count"] == 3 and detail["dataset"]["size_bytes"] == 6
    # the same upload again: a new version
    browser.post("/datasets", data={"name": "cats"}, files=_folder(("x/1.jpg", b"one")))
    assert ann.get("/api/v1/datasets/cats").json()["dataset"]["current_version"] == 2
    r = browser.post("/datasets/cats/delete")
    assert r.status_code == 303 and r.headers["location"] == "/datasets?removed=cats"
    assert ann.get("/api/v1/datasets").json()["datasets"] == []


def test_refusals_are_shown_on_the_page(browser: TestClient, ann: Caller, rt: Runtime) -> None:
    r = browser.post("/datasets", data={"name": "Bad Name"}, files=_folder(("a", b"x")))
    assert r.status_code == 422 and "not a valid dataset name" in r.text
    assert 'value="Bad Name"' in r.text
    r = browser.post("/datasets", data={"name": "ok"}, files=_folder(("../up", b"x")))
    assert r.status_code == 422 and "outside the dataset" in r.text
    r = browser.post("/datasets", data={"name": "ok"})
    assert r.status_code == 422 and "at least one file" in r.text
    rt.settings.storage_quota_gb = 0.000_001  # 1 kB
    r = browser.post("/datasets", data={"name": "ok"}, files=_folder(("big", b"x" * 2000)))
    assert r.status_code == 413 and "quota" in r.text
    assert ann.get("/api/v1/datasets").json()["datasets"] == []
    # a form from another site is refused
    r = browser.post(
        "/datasets",
        data={"name": "ok"},
        files=_folder(("a", b"x")),
        headers={"Origin": "http://evil.example"},
    )
    assert r.status_code == 403


def test_logged_out_goes_to_login(http: TestClient) -> None:
    client = console_client(http.app)
    r = client.get("/datasets")
    assert r.status_code == 303 and r.headers["location"].startswith("/login")
    client.close()


def test_dataset_paths() -> None:
    assert dataset_paths(["top/a", "top/b/c"]) == ["a", "b/c"]
    assert dataset_paths(["a", "b"]) == ["a", "b"]
    assert dataset_paths(["x/a", "y/b"]) == ["x/a", "y/b"]
    assert dataset_paths(["../a"]) == ["../a"]  # refused later, never made harmless here
