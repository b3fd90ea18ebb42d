"""GET /api/v1/estimate: every catalog model at the server's prices; clear 422s; auth."""

from __future__ import annotations

from starlette.testclient import TestClient

from factories import Caller

QUERY = {"model": "resnet50", "images": "100000", "epochs": "30", "image_size": "224"}


def test_estimate_covers_the_catalog_at_its_prices(ann: Caller, http: TestClient) -> None:
    assert http.get("/api/v1/estimate", params=QUERY).status_code == 401
    r = ann.get("/api/v1/estimate", params=QUERY)
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["model"], got["images"], got["epochs"], got["gpus"]) == ("resnet50", 100000, 30, 1)
    assert got["currency_symbol"] == "$" and got["total_pflops"] == 73.62
    rows = {row["gpu_model"]: row for row in got["rows"]}
    gpus = {m["name"] for m in ann.get("/api/v1/gpus").json()}
    assert set(rows) == gpus
    a100 = rows["A100-80GB"]
    assert a100["basis"] == "published" and a100["wall_seconds"] == 1215
    assert a100["cost_micro"] == 900_000 * 1215 // 3600 and a100["cost"] == "$0.3037"
    assert a100["ncu"] == "0.014062"
    assert rows["A100-80GB"]["wall_seconds"] < rows["T4"]["wall_seconds"]
    assert rows["CPU"]["basis"] == "rough" and not rows["CPU"]["is_gpu"]
    assert any("NCU" in note for note in got["notes"])
    eight = ann.get("/api/v1/estimate", params={**QUERY, "gpus": "8"}).json()
    assert eight["scaling_efficiency"] == 0.85
    assert {r["gpu_model"]: r for r in eight["rows"]}["A100-80GB"]["devices"] == 8


def test_bad_input_is_a_422_that_lists_what_is_valid(ann: Caller) -> None:
    cases = [
        ({**QUERY, "model": "alexnet"}, "unknown model 'alexnet'"),
        ({**QUERY, "images": "0"}, "images must be from 1 to 1,000,000,000"),
        ({**QUERY, "images": "lots"}, "images must be a whole number"),
        ({**QUERY, "epochs": "10001"}, "epochs must be from 1 to 10,000"),
        ({**QUERY, "image_size": "4"}, "image_size must be from 8 to 2,048"),
        ({**QUERY, "gpus": "65"}, "gpus must be from 1 to 64"),
        ({"model": "resnet50", "images": "10"}, "epochs is missing"),
        ({}, "model is missing"),
    ]
    for params, says in cases:
        r = ann.get("/api/v1/estimate", params=params)
        assert r.status_code == 422, (params, r.text)
        detail = r.json()["detail"]
        assert says in detail
        assert "resnet18, resnet50, resnet101, vit_b_16" in detail and "small_cnn" in detail
        assert "image_size 8–2048" in detail
