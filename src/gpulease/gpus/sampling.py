"""Readings of GPUs through NVML (utilisation, memory, power, temperature) for GPU samples.

Simulated GPUs (uuid `SIM-…`) are never read: they have no numbers, and none are invented.
Each quantity is read on its own; one that NVML cannot give (not supported, a lost GPU)
is None while the others are still reported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpulease.gpus.discovery import Nvml, load_pynvml

log = logging.getLogger(__name__)

SIMULATED_PREFIX = "SIM-"
_MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuReading:
    uuid: str
    time: float  # seconds since the epoch
    util_pct: float | None
    memory_used_mb: int | None
    memory_total_mb: int | None
    power_w: float | None
    temperature_c: float | None

    def to_json(self) -> dict[str, object]:
        return {
            "uuid": self.uuid,
            "time": self.time,
            "util_pct": self.util_pct,
            "memory_used_mb": self.memory_used_mb,
            "memory_total_mb": self.memory_total_mb,
            "power_w": self.power_w,
            "temperature_c": self.temperature_c,
        }


def real_uuids(uuids: Sequence[str]) -> list[str]:
    return [uuid for uuid in uuids if uuid and not uuid.startswith(SIMULATED_PREFIX)]


def _one(nvml: Nvml, what: str, uuid: str, read: Callable[[], Any]) -> Any:
    try:
        return read()
    except (nvml.NVMLError, OSError, AttributeError, TypeError, ValueError) as exc:
        log.debug("GPU %s: NVML cannot read its %s: %s", uuid, what, exc)
        return None


def _reading(nvml: Nvml, uuid: str, now: float) -> GpuReading | None:
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
    except nvml.NVMLError as exc:
        log.warning("GPU %s cannot be found through NVML: %s", uuid, exc)
        return None
    util = _one(
        nvml, "utilisation", uuid, lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    )
    memory = _one(nvml, "memory", uuid, lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    used = (
        _one(nvml, "memory used", uuid, lambda: int(memory.used) // _MIB)
        if memory is not None
        else None
    )
    total = (
        _one(nvml, "memory total", uuid, lambda: int(memory.total) // _MIB)
        if memory is not None
        else None
    )
    power = _one(nvml, "power", uuid, lambda: int(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0)
    temperature = _one(
        nvml,
        "temperature",
        uuid,
        lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
    )
    return GpuReading(uuid, now, util, used, total, power, temperature)


def read_gpus(
    nvml: Nvml | None,
    uuids: Sequence[str],
    clock: Callable[[], float] = time.time,
) -> list[GpuReading]:
    """One reading of each real GPU in uuids, in that order; [] for simulated GPUs and when
    NVML is not available. A GPU NVML cannot find is left out. nvml None: the real pynvml.

    NVML is initialised and shut down around the readings (its init is reference counted:
    a caller that keeps NVML initialised makes this cheap)."""
    wanted = real_uuids(uuids)
    if not wanted:
        return []
    api = nvml if nvml is not None else load_pynvml()
    if api is None:
        return []
    try:
        api.nvmlInit()
    except (api.NVMLError, OSError) as exc:
        log.debug("NVML is not available: %s", exc)
        return []
    try:
        now = clock()
        readings = [_reading(api, uuid, now) for uuid in wanted]
        return [reading for reading in readings if reading is not None]
    finally:
        try:
            api.nvmlShutdown()
        except api.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)


class GpuSampler:
    """read_gpus for one set of GPUs, with NVML kept initialised between readings."""

    def __init__(self, uuids: Sequence[str], nvml: Nvml | None = None) -> None:
        self.uuids = real_uuids(uuids)
        self._nvml = nvml if nvml is not None or not self.uuids else load_pynvml()
        self._open = False
        if self._nvml is not None:
            try:
                self._nvml.nvmlInit()
                self._open = True
            except (self._nvml.NVMLError, OSError) as exc:
                log.info("NVML is not available (%s): no GPU samples", exc)
                self._nvml = None

    @property
    def active(self) -> bool:
        """Whether there is anything to sample (real GPUs and a working NVML)."""
        return bool(self.uuids) and self._nvml is not None

    def read(self) -> list[GpuReading]:
        if not self.active:
            return []
        return read_gpus(self._nvml, self.uuids)

    def close(self) -> None:
        if self._open and self._nvml is not None:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.debug("nvmlShutdown failed: %s", exc)
