"""What every API route shares: one transaction per request, ids a database column holds."""

from __future__ import annotations

import pytest

from factories import Caller
from gpulease.core.ids import MAX_ID, parse_id

HUGE = str(MAX_ID + 1)


def test_a_request_that_fails_halfway_leaves_nothing_behind(ann: Caller) -> None:
    # the instance is made, then mounting a dataset that does not exist fails: all of it
    # rolls back, so no instance (and no hold on GPUs) is left
    r = ann.post("/api/v1/instances", json={"gpu": "T4:1", "datasets": ["no-such-data"]})
    assert r.status_code == 404, r.text
    assert ann.get("/api/v1/instances", params={"all": True}).json() == []
    assert ann.post("/api/v1/instances", json={"gpu": "T4:1"}).status_code == 201


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"/api/v1/support/tickets/{HUGE}"),
        ("DELETE", f"/api/v1/tokens/{HUGE}"),
        ("POST", f"/api/v1/notifications/{HUGE}/read"),
        ("GET", f"/api/v1/runs/{HUGE}/metrics"),
        ("GET", "/api/v1/support/tickets/0"),
        ("GET", f"/api/v1/support/tickets/{2**40}"),  # above PostgreSQL's INTEGER
        ("GET", f"/api/v1/runs/{2**63}"),
    ],
)
def test_an_id_too_large_for_the_database_is_a_422(ann: Caller, method: str, path: str) -> None:
    r = ann.http.request(method, path, headers=ann.headers)
    assert r.status_code == 422, r.text


@pytest.mark.parametrize("ref", [HUGE, "²", "٣", "1²"])
def test_an_instance_ref_that_is_no_id_is_simply_not_found(ann: Caller, ref: str) -> None:
    r = ann.get(f"/api/v1/instances/{ref}")
    assert r.status_code == 404 and "gpulease instance ls" in r.json()["detail"]


@pytest.mark.parametrize("ids", [HUGE, "1,²", "-1", "1, x"])
def test_compared_run_ids_must_be_ids(ann: Caller, ids: str) -> None:
    r = ann.get("/api/v1/runs/compare", params={"ids": ids})
    assert r.status_code == 422 and "ids=4,7,9" in r.json()["detail"]


@pytest.mark.parametrize("since", [f"-1:{HUGE}", f"{HUGE}:0", "²:0", "-2:0"])
def test_a_stream_position_out_of_range_is_refused(ann: Caller, since: str) -> None:
    r = ann.get("/api/v1/runs/1/stream", params={"since": since})
    assert r.status_code == 422 and "LOG_SEQ:POINT_ID" in r.json()["detail"]


def test_parse_id_takes_ascii_digits_within_an_id_column() -> None:
    assert parse_id("42") == 42
    assert parse_id(str(MAX_ID)) == MAX_ID
    for text in (HUGE, "²", "٣", "-1", "+1", " 1", "0", "", "1.0"):
        assert parse_id(text) is None, text


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/v1/support/tickets", {"subject": "s", "body": "b", "run_id": 2**64}),
        ("PUT", "/api/v1/instances/1/autostop", {"stop_after_run": 2**64}),
        ("POST", "/api/v1/datasets/x/pushes", {"name": "x", "files": 2**64, "bytes": 1}),
        ("POST", "/api/v1/instances", {"gpu": f"T4:{2**64}"}),
    ],
)
def test_a_number_too_large_for_the_database_in_a_body_is_a_422(
    ann: Caller, method: str, path: str, body: dict[str, object]
) -> None:
    r = ann.http.request(method, path, json=body, headers=ann.headers)
    assert r.status_code == 422, r.text


def test_a_cron_that_names_no_real_date_is_refused(ann: Caller) -> None:
    iid = ann.post("/api/v1/instances", json={"gpu": "T4:1"}).json()["id"]
    r = ann.post(
        f"/api/v1/instances/{iid}/schedules", json={"action": "stop", "cron": "0 0 31 2 *"}
    )
    assert r.status_code == 422 and "31 February" in r.json()["detail"]


def test_a_voucher_expiry_without_a_zone_is_utc(admin: Caller) -> None:
    body = {"amount": "1", "expires_at": "2999-12-31T23:59:00"}
    r = admin.post("/api/v1/admin/vouchers", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["expires_at"].startswith("2999-12-31T23:59:00")


def test_a_log_position_past_any_chunk_finds_nothing(ann: Caller) -> None:
    iid = ann.post("/api/v1/instances", json={"gpu": "T4:1"}).json()["id"]
    run = ann.post(f"/api/v1/instances/{iid}/runs", json={"command": "true"}).json()
    r = ann.get(f"/api/v1/runs/{run['id']}/logs", params={"after": 2**64})
    assert r.status_code == 200 and r.json()["chunks"] == []
