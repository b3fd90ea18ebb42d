"""GET /metrics: the Prometheus text exposition, read from the database at scrape time.

Each app has its own registry (never prometheus_client's global one): the database
collector below, and the request-latency histogram its middleware fills. With
GPULEASE_METRICS_TOKEN set, a scrape must send `Authorization: Bearer TOKEN`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpulease.core.money import MICRO
from gpulease.server.db import transaction
from gpulease.server.observability.latency import LatencyMiddleware
from gpulease.server.routers.deps import bearer
from gpulease.server.runtime import Runtime
from gpulease.server.services import fleet_metrics, metrics

PATH = "/metrics"
MIB = 1024 * 1024
GPU_LABELS = ["node", "gpu", "uuid", "model"]


class DatabaseCollector(Collector):
    """Reads the fleet, the instances and the ledger in one short transaction per scrape."""

    def __init__(self, runtime: Callable[[], Runtime]) -> None:
        self.runtime = runtime

    def describe(self) -> list[Metric]:
        return []  # names are only known at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        with transaction(self.runtime().sessions) as session:
            readings = metrics.latest_gpu_samples(session)
            states = fleet_metrics.instances_by_state(session)
            queued = fleet_metrics.queue_length(session)
            billed = fleet_metrics.billed_by_kind(session)
            gpus = fleet_metrics.gpu_counts(session)

        util = GaugeMetricFamily(
            "gpulease_gpu_utilization_percent",
            "GPU utilisation in the newest NVML sample (simulated GPUs have none)",
            labels=GPU_LABELS,
        )
        used = GaugeMetricFamily(
            "gpulease_gpu_memory_used_bytes", "GPU memory in use, newest sample", labels=GPU_LABELS
        )
        total = GaugeMetricFamily(
            "gpulease_gpu_memory_total_bytes", "GPU memory in all, newest sample", labels=GPU_LABELS
        )
        power = GaugeMetricFamily(
            "gpulease_gpu_power_watts", "GPU power draw, newest sample", labels=GPU_LABELS
        )
        temperature = GaugeMetricFamily(
            "gpulease_gpu_temperature_celsius", "GPU temperature, newest sample", labels=GPU_LABELS
        )
        sampled = GaugeMetricFamily(
            "gpulease_gpu_sample_timestamp_seconds",
            "When the newest sample of the GPU was taken (Unix time)",
            labels=GPU_LABELS,
        )
        for gpu in readings:
            sample = gpu["sample"]
            if gpu["simulated"] or sample is None:
                continue  # nothing read (or nothing fresh): no series, never an invented 0
            labels = [gpu["node"], str(gpu["index"]), gpu["uuid"], gpu["model"] or gpu["nvml_name"]]
            sampled.add_metric(labels, sample["time"])
            for family, key, scale in (
                (util, "util_pct", 1),
                (used, "memory_used_mb", MIB),
                (total, "memory_total_mb", MIB),
                (power, "power_w", 1),
                (temperature, "temperature_c", 1),
            ):
                if sample[key] is not None:
                    family.add_metric(labels, sample[key] * scale)
        yield from (util, used, total, power, temperature, sampled)

        count = GaugeMetricFamily(
            "gpulease_gpus",
            "GPUs present, by model, simulated or not, held or free",
            labels=["model", "simulated", "state"],
        )
        for g in gpus:
            state = "held" if g.held else "free"
            count.add_metric([g.model, str(g.simulated).lower(), state], g.count)
        yield count

        by_state = GaugeMetricFamily("gpulease_instances", "Instances by state", labels=["state"])
        for state, n in states.items():
            by_state.add_metric([state], n)
        yield by_state
        yield GaugeMetricFamily(
            "gpulease_queue_length", "Instances queued, waiting for GPUs", value=queued
        )

        money = CounterMetricFamily(
            "gpulease_billed_credits",
            "Credits billed to renters since the start (the ledger's revenue account), by kind",
            labels=["kind"],
        )
        for kind, micro in sorted(billed.items()):
            money.add_metric([kind], micro / MICRO)
        yield money


def _refusal(message: str) -> Response:
    return Response(
        message + "\n",
        status_code=401,
        media_type="text/plain",
        headers={"WWW-Authenticate": "Bearer"},
    )


def install(app: FastAPI) -> None:
    """Give app its registry, the latency middleware and the GET /metrics route."""
    registry = CollectorRegistry(auto_describe=False)
    latency = Histogram(
        "gpulease_http_request_duration_seconds",
        "Seconds from a request's arrival to the start of its response, by route template",
        ["method", "route"],
        registry=registry,
    )
    registry.register(DatabaseCollector(lambda: app.state.runtime))
    app.state.prometheus = registry
    app.add_middleware(LatencyMiddleware, histogram=latency)

    @app.get(PATH, include_in_schema=False)
    def metrics(request: Request) -> Response:
        token = app.state.runtime.settings.metrics_token
        if token is not None:
            sent = bearer(request)
            if sent is None:
                return _refusal(
                    "this server's metrics need 'Authorization: Bearer TOKEN' "
                    "(the GPULEASE_METRICS_TOKEN the operator set)"
                )
            if not secrets.compare_digest(sent.encode(), token.get_secret_value().encode()):
                return _refusal("wrong metrics token; use the server's GPULEASE_METRICS_TOKEN")
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
