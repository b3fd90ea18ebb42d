"""GPU readings for samples against a fake NVML, where each quantity can fail on its own."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx

from gpulease.gpus.sampling import GpuReading, GpuSampler, read_gpus
from gpulease.runner.connection import Connection
from gpulease.runner.metrics import sample_gpus, send_gpu_samples

MIB = 1024 * 1024


class FakeNVMLError(Exception):
    pass


@dataclass
class SamplingNvml:
    """NVML as the driver answers the sampling calls; `broken` names (uuid, quantity) pairs
    that raise NVMLError ("handle" for a GPU NVML cannot find)."""

    gpus: dict[str, dict[str, Any]] = field(default_factory=dict)
    broken: set[tuple[str, str]] = field(default_factory=set)
    init_error: Exception | None = None
    calls: list[str] = field(default_factory=list)

    NVMLError = FakeNVMLError
    NVML_TEMPERATURE_GPU = 0

    def _check(self, uuid: str, what: str) -> dict[str, Any]:
        if (uuid, what) in self.broken:
            raise FakeNVMLError(f"{what}: Not Supported")
        return self.gpus[uuid]

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        self.calls.append(f"handle {text}")
        if text not in self.gpus:
            raise FakeNVMLError("Not Found")
        self._check(text, "handle")
        return text

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return SimpleNamespace(gpu=self._check(handle, "util")["util"], memory=5)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        gpu = self._check(handle, "memory")
        return SimpleNamespace(used=gpu["used_mb"] * MIB, total=gpu["total_mb"] * MIB, free=0)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._check(handle, "power")["power_mw"])

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return int(self._check(handle, "temperature")["temp"])


def _gpu(util: int = 93, used_mb: int = 1200, power_mw: int = 250_500, temp: int = 61) -> Any:
    return {"util": util, "used_mb": used_mb, "total_mb": 81920, "power_mw": power_mw, "temp": temp}


def test_readings_of_real_gpus() -> None:
    nvml = SamplingNvml(gpus={"GPU-a": _gpu(), "GPU-b": _gpu(util=0, used_mb=0, temp=30)})
    readings = read_gpus(nvml, ["GPU-a", "GPU-b"], clock=lambda: 1.7e9)
    assert readings == [
        GpuReading("GPU-a", 1.7e9, 93.0, 1200, 81920, 250.5, 61.0),
        GpuReading("GPU-b", 1.7e9, 0.0, 0, 81920, 250.5, 30.0),
    ]
    assert readings[0].to_json() == {
        "uuid": "GPU-a",
        "time": 1.7e9,
        "util_pct": 93.0,
        "memory_used_mb": 1200,
        "memory_total_mb": 81920,
        "power_w": 250.5,
        "temperature_c": 61.0,
    }
    assert nvml.calls[0] == "init" and nvml.calls[-1] == "shutdown"


def test_each_quantity_fails_on_its_own() -> None:
    nvml = SamplingNvml(
        gpus={"GPU-a": _gpu(), "GPU-b": _gpu(), "GPU-c": _gpu()},
        broken={("GPU-a", "power"), ("GPU-a", "temperature"), ("GPU-b", "util"),
                ("GPU-b", "memory"), ("GPU-c", "handle")},
    )  # fmt: skip
    a, b = read_gpus(nvml, ["GPU-a", "GPU-b", "GPU-c", "GPU-lost"], clock=lambda: 1.0)
    assert a == GpuReading("GPU-a", 1.0, 93.0, 1200, 81920, None, None)
    assert b == GpuReading("GPU-b", 1.0, None, None, None, 250.5, 61.0)
    assert nvml.calls[-1] == "shutdown"


def test_simulated_gpus_and_no_nvml_give_nothing() -> None:
    nvml = SamplingNvml(gpus={"GPU-a": _gpu()})
    assert read_gpus(nvml, ["SIM-T4-0", "SIM-A100-80GB-1"]) == []
    assert read_gpus(nvml, []) == []
    assert nvml.calls == []  # NVML is not even touched
    broken = SamplingNvml(gpus={"GPU-a": _gpu()}, init_error=FakeNVMLError("Driver Not Loaded"))
    assert read_gpus(broken, ["GPU-a", "SIM-T4-0"]) == []
    assert read_gpus(None, ["SIM-T4-0"]) == []
    sampler = GpuSampler(["SIM-T4-0"])
    assert not sampler.active and sampler.read() == []


def test_the_sampler_keeps_nvml_open_between_readings() -> None:
    nvml = SamplingNvml(gpus={"GPU-a": _gpu()})
    sampler = GpuSampler(["GPU-a", "SIM-T4-0"], nvml=nvml)
    assert sampler.active and sampler.uuids == ["GPU-a"]
    assert [r.uuid for r in sampler.read()] == ["GPU-a"]
    assert [r.uuid for r in sampler.read()] == ["GPU-a"]
    sampler.close()
    sampler.close()
    inits = nvml.calls.count("init")
    assert inits == 3 and nvml.calls.count("shutdown") == 3 and nvml.calls[0] == "init"


def test_samples_are_posted_and_kept_while_the_server_is_away() -> None:
    bodies: list[Any] = []
    answers = [503]
    finished = threading.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        if answers:
            return httpx.Response(answers.pop())
        bodies.append(request.read())
        finished.set()
        return httpx.Response(204)

    connection = Connection(
        "http://server", "t", on_stop=lambda r: None, transport=httpx.MockTransport(handler)
    )
    times = iter(range(100))

    def sample() -> list[GpuReading]:
        return [GpuReading("GPU-a", float(next(times)), 1.0, 1, 2, 3.0, 4.0)]

    send_gpu_samples(connection, sample, 0.01, finished)
    (body,) = bodies
    samples = httpx.Response(200, content=body).json()["samples"]
    assert [s["time"] for s in samples] == [0.0, 1.0]  # the undelivered one went along
    assert samples[0]["uuid"] == "GPU-a" and samples[0]["power_w"] == 3.0


def test_a_runner_with_simulated_gpus_samples_nothing() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no call expected")

    connection = Connection(
        "http://server", "t", on_stop=lambda r: None, transport=httpx.MockTransport(handler)
    )
    sample_gpus(connection, ["SIM-T4-0"], 0.01, threading.Event())  # returns at once
