"""Off-peak windows through the API: a discount is a percentage above 0 and at most 100."""

from __future__ import annotations

import pytest

from factories import Caller

WINDOW = {"weekdays": "all", "start": "00:00", "end": "06:00"}


@pytest.mark.parametrize("discount", ["nan", "inf", "-inf", "-10", "0", "101", "forty", ""])
def test_a_discount_that_is_no_percentage_is_a_422_saying_what_is_allowed(
    admin: Caller, discount: str
) -> None:
    r = admin.post("/api/v1/admin/offpeak", json={**WINDOW, "discount": discount})
    assert r.status_code == 422, r.text
    assert "at most 100" in r.json()["detail"]
    assert admin.get("/api/v1/offpeak").json() == []


def test_a_window_keeps_its_discount_as_typed(admin: Caller, ann: Caller) -> None:
    r = admin.post("/api/v1/admin/offpeak", json={**WINDOW, "discount": "12.5 %"})
    assert r.status_code == 201, r.text
    assert r.json()["discount_percent"] == "12.5"
    assert [w["discount_percent"] for w in ann.get("/api/v1/offpeak").json()] == ["12.5"]
    refused = ann.post("/api/v1/admin/offpeak", json={**WINDOW, "discount": "40"})
    assert refused.status_code == 403
