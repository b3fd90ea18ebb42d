"""GET /metrics: Prometheus's own parser reads it, and its figures match the database."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from pydantic import SecretStr
from sqlalchemy import BigInteger, func, select
from starlette.testclient import TestClient

from factories import Caller, RunnerDouble
from gpulease.server.app import create_app
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Gpu, GpuSample, LedgerAccount, LedgerEntry, LedgerTransaction, Node
from gpulease.server.runtime import Runtime
from gpulease.server.services import ledger, metering, metrics
from gpulease.server.settings import Settings

REAL_UUID = "GPU-0b9c6a56-real"


def scrape(http: TestClient, **headers: str) -> dict[str, list[Sample]]:
    r = http.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=")
    return {f.name: f.samples for f in text_string_to_metric_families(r.text)}


def values(samples: list[Sample], name: str, **labels: str) -> list[float]:
    return [
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def _start(owner: Caller, gpu: str, name: str, tick: Callable[[], None]) -> int:
    r = owner.post("/api/v1/instances", json={"gpu": gpu, "name": name})
    assert r.status_code == 201, r.text
    tick()
    return int(r.json()["id"])


def test_metrics_match_a_known_state(
    http: TestClient,
    rt: Runtime,
    ann: Caller,
    bob: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    running = _start(ann, "A100-80GB:2", "big", tick)
    runner_for(running).ready()
    _start(bob, "T4:1", "small", tick)  # placed, its runner not ready yet: starting
    _start(bob, "A100-80GB:1", "waits", tick)  # both A100s are taken: queued
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, running)
        assert seg is not None
        seg.started_at -= timedelta(hours=1)
        session.flush()
        metering.charge_segment(session, seg, seg.started_at + timedelta(hours=1))
        usage_micro = session.scalar(
            select(func.sum(LedgerEntry.amount).cast(BigInteger))
            .join(LedgerTransaction, LedgerTransaction.id == LedgerEntry.transaction_id)
            .join(LedgerAccount, LedgerAccount.id == LedgerEntry.account_id)
            .where(LedgerTransaction.kind == "usage", LedgerAccount.kind == ledger.REVENUE)
        )
        # A real GPU beside the simulated ones, with one reading; and a stray row for a
        # simulated GPU, which must not show (simulated GPUs have no readings).
        node = session.scalars(select(Node)).one()
        session.add(
            Gpu(
                node_id=node.id,
                index=7,
                uuid=REAL_UUID,
                nvml_name="NVIDIA A100-SXM4-80GB",
                model="A100-80GB",
                memory_mb=81920,
                simulated=False,
            )
        )
        session.flush()
        reading = metrics.GpuReadingIn(
            uuid=REAL_UUID,
            time=utcnow().timestamp() - 2,
            util_pct=93.5,
            memory_used_mb=1200,
            memory_total_mb=81920,
            power_w=250.0,
            temperature_c=61.0,
        )
        assert metrics.ingest_node_readings(session, node.id, [reading]) == 1
        simulated = session.scalars(select(Gpu).where(Gpu.simulated.is_(True))).first()
        assert simulated is not None
        session.add(
            GpuSample(node_id=node.id, gpu_uuid=simulated.uuid, time=utcnow(), util_pct=50.0)
        )
    assert usage_micro == 1_800_000  # two A100s for an hour at $0.90

    for _ in range(3):
        assert http.get("/healthz").status_code == 200
    assert ann.get("/api/v1/instances/big").status_code == 200
    assert ann.get("/api/v1/instances/nothing-here").status_code == 404

    families = scrape(http)
    states = families["gpulease_instances"]
    assert values(states, "gpulease_instances", state="running") == [1]
    assert values(states, "gpulease_instances", state="starting") == [1]
    assert values(states, "gpulease_instances", state="queued") == [1]
    assert values(states, "gpulease_instances", state="failed") == [0]
    assert sum(s.value for s in states) == 3
    assert values(families["gpulease_queue_length"], "gpulease_queue_length") == [1]

    billed = families["gpulease_billed_credits"]
    assert values(billed, "gpulease_billed_credits_total", kind="usage") == [usage_micro / 1e6]

    gpu = {"node": rt.node_name, "gpu": "7", "uuid": REAL_UUID, "model": "A100-80GB"}
    util = families["gpulease_gpu_utilization_percent"]
    assert values(util, "gpulease_gpu_utilization_percent", **gpu) == [93.5]
    assert len(util) == 1  # only the real GPU: simulated ones have no series at all
    used = families["gpulease_gpu_memory_used_bytes"]
    assert values(used, "gpulease_gpu_memory_used_bytes", **gpu) == [1200 * 1024 * 1024]
    total = families["gpulease_gpu_memory_total_bytes"]
    assert values(total, "gpulease_gpu_memory_total_bytes", **gpu) == [81920 * 1024 * 1024]
    assert values(families["gpulease_gpu_power_watts"], "gpulease_gpu_power_watts") == [250.0]
    counts = families["gpulease_gpus"]
    assert values(counts, "gpulease_gpus", model="A100-80GB", simulated="true", state="held") == [2]
    assert values(counts, "gpulease_gpus", model="A100-80GB", simulated="false", state="free") == [
        1
    ]

    latency = families["gpulease_http_request_duration_seconds"]
    name = "gpulease_http_request_duration_seconds_count"
    assert values(latency, name, method="GET", route="/healthz") == [3]
    assert values(latency, name, method="GET", route="/api/v1/instances/{ref}") == [2]
    assert values(latency, name, method="POST", route="/api/v1/instances") == [3]
    inf = values(
        latency,
        "gpulease_http_request_duration_seconds_bucket",
        method="GET",
        route="/healthz",
        le="+Inf",
    )
    assert inf == [3]
    assert not any("nothing-here" in s.labels.get("route", "") for s in latency)

    # The first scrape itself is counted by the next one; unrouted paths share one label.
    for path in ("/no/such/page", "/another/one", "/static/console.css"):
        http.get(path)
    latency = scrape(http)["gpulease_http_request_duration_seconds"]
    assert values(latency, name, method="GET", route="/metrics") == [1]
    assert values(latency, name, method="GET", route="unmatched") == [2]
    assert values(latency, name, method="GET", route="/static/{path}") == [1]


def test_a_metrics_token_is_required_when_set(settings: Settings, rt: Runtime) -> None:
    guarded = dataclasses.replace(
        rt, settings=settings.model_copy(update={"metrics_token": SecretStr("scrape-me-9")})
    )
    app = create_app(guarded.settings, runtime=guarded, reconcilers=False)
    with TestClient(app) as client:
        missing = client.get("/metrics")
        assert missing.status_code == 401 and "GPULEASE_METRICS_TOKEN" in missing.text
        assert missing.headers["www-authenticate"] == "Bearer"
        wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "wrong metrics token" in wrong.text
        families = scrape(client, Authorization="Bearer scrape-me-9")
        assert "gpulease_instances" in families
