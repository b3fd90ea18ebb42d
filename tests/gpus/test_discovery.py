"""GPU discovery against a fake NVML (the hardware boundary) and the real pynvml of this host."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from gpulease.core.catalog import load_catalog
from gpulease.core.errors import InvalidInput
from gpulease.gpus.discovery import cuda_version_text, discover

CATALOG = load_catalog(None)
MIB = 1024 * 1024


class FakeNVMLError(Exception):
    pass


@dataclass
class FakeNvml:
    """NVML as the driver answers it: a list of (name, uuid, MiB), names as bytes if asked."""

    devices: list[tuple[str, str, int]] = field(default_factory=list)
    as_bytes: bool = False
    init_error: Exception | None = None
    broken_index: int | None = None
    calls: list[str] = field(default_factory=list)

    NVMLError = FakeNVMLError

    def _out(self, text: str) -> str | bytes:
        return text.encode() if self.as_bytes else text

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if index == self.broken_index:
            raise FakeNVMLError("GPU is lost")
        return index

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        return self._out(self.devices[handle][0])

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:
        return self._out(self.devices[handle][1])

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return SimpleNamespace(total=self.devices[handle][2] * MIB, used=0, free=0)

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        return self._out("550.54.15")

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12040

    # The sampling calls of the Nvml protocol (tests/gpus/test_sampling.py reads them).
    NVML_TEMPERATURE_GPU = 0

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        return next(i for i, device in enumerate(self.devices) if device[1] == text)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return SimpleNamespace(gpu=0, memory=0)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return 0

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return 0


A100_80 = ("NVIDIA A100-SXM4-80GB", "GPU-aaaa", 81920)
A100_40 = ("NVIDIA A100-PCIE-40GB", "GPU-bbbb", 40960)
T4 = ("Tesla T4", "GPU-cccc", 15360)


def test_real_gpus_are_matched_to_catalog_models() -> None:
    nvml = FakeNvml(devices=[A100_80, A100_40, T4])

    inventory = discover(CATALOG, nvml=nvml)

    assert inventory.driver_version == "550.54.15"
    assert inventory.cuda_version == "12.4"
    assert [(g.index, g.uuid, g.model, g.memory_mb) for g in inventory.gpus] == [
        (0, "GPU-aaaa", "A100-80GB", 81920),
        (1, "GPU-bbbb", "A100-40GB", 40960),
        (2, "GPU-cccc", "T4", 15360),
    ]
    assert inventory.gpus[0].nvml_name == "NVIDIA A100-SXM4-80GB"
    assert not any(g.simulated for g in inventory.gpus)
    assert nvml.calls == ["init", "shutdown"]


def test_bytes_from_old_pynvml_are_decoded() -> None:
    inventory = discover(CATALOG, nvml=FakeNvml(devices=[T4], as_bytes=True))

    assert inventory.driver_version == "550.54.15"
    assert inventory.gpus[0].nvml_name == "Tesla T4"
    assert inventory.gpus[0].uuid == "GPU-cccc"


def test_unknown_gpu_is_listed_without_model_and_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="gpulease.gpus.discovery"):
        inventory = discover(
            CATALOG, nvml=FakeNvml(devices=[("NVIDIA GeForce GTX 1080", "G", 8192)])
        )

    assert inventory.gpus[0].model is None
    assert "GTX 1080" in caplog.text
    assert "nvml_match" in caplog.text


@pytest.mark.parametrize(
    "error", [FakeNVMLError("NVML Shared Library Not Found"), OSError("libnvidia-ml.so.1")]
)
def test_host_without_driver_is_cpu_only(error: Exception) -> None:
    inventory = discover(CATALOG, nvml=FakeNvml(devices=[T4], init_error=error))

    assert inventory.gpus == []
    assert inventory.driver_version is None
    assert inventory.cuda_version is None


def test_unreadable_gpu_is_left_out_and_nvml_shut_down() -> None:
    nvml = FakeNvml(devices=[T4, A100_80], broken_index=0)

    inventory = discover(CATALOG, nvml=nvml)

    assert [(g.index, g.model) for g in inventory.gpus] == [(1, "A100-80GB")]
    assert nvml.calls[-1] == "shutdown"


def test_simulated_gpus_follow_the_real_ones() -> None:
    inventory = discover(CATALOG, simulated="a100-80gb:2, T4:1,T4", nvml=FakeNvml(devices=[T4]))

    assert [(g.index, g.uuid, g.model, g.memory_mb, g.simulated) for g in inventory.gpus] == [
        (0, "GPU-cccc", "T4", 15360, False),
        (1, "SIM-A100-80GB-0", "A100-80GB", 81920, True),
        (2, "SIM-A100-80GB-1", "A100-80GB", 81920, True),
        (3, "SIM-T4-0", "T4", 16384, True),
        (4, "SIM-T4-1", "T4", 16384, True),
    ]


@pytest.mark.parametrize(
    ("simulated", "words"),
    [
        ("B200:4", ["'B200:4'", "unknown GPU model", "A100-80GB"]),
        ("T4:0", ["at least 1"]),
        ("T4:x", ["whole number"]),
        ("CPU:2", ["not a GPU model"]),
    ],
)
def test_simulated_typos_are_refused_with_a_clear_message(simulated: str, words: list[str]) -> None:
    with pytest.raises(InvalidInput) as caught:
        discover(CATALOG, simulated=simulated, nvml=FakeNvml())

    for word in words:
        assert word in caught.value.message
    assert "MODEL:COUNT" in caught.value.message


def test_cuda_version_text() -> None:
    assert cuda_version_text(12040) == "12.4"
    assert cuda_version_text(13000) == "13.0"
    assert cuda_version_text(11080) == "11.8"


def test_real_pynvml_on_this_host_does_not_crash() -> None:
    inventory = discover(CATALOG, simulated="T4:1")

    real = [g for g in inventory.gpus if not g.simulated]
    simulated = [g for g in inventory.gpus if g.simulated]
    assert [g.uuid for g in simulated] == ["SIM-T4-0"]
    assert simulated[0].index == len(real)
    if not real:  # a CPU-only host, like CI
        assert inventory.driver_version is None
