"""GPU inventory of this host through NVML, plus the simulated GPUs an operator declares."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gpulease.core.catalog import Catalog, parse_accelerators
from gpulease.core.errors import InvalidInput

log = logging.getLogger(__name__)

_MIB = 1024 * 1024


class Nvml(Protocol):
    """The part of NVML (the `pynvml` module of nvidia-ml-py) that discovery and sampling use."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetCudaDriverVersion_v2(self) -> int: ...

    # sampling (gpus/sampling.py)
    NVML_TEMPERATURE_GPU: int

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...


@dataclass(frozen=True)
class DiscoveredGpu:
    index: int  # NVML index (PCI bus order); what CUDA_VISIBLE_DEVICES names
    uuid: str
    nvml_name: str
    model: str | None  # the catalog model; None when the catalog has no match
    memory_mb: int
    simulated: bool = False


@dataclass(frozen=True)
class Inventory:
    driver_version: str | None
    cuda_version: str | None  # the newest CUDA the driver supports, "12.4"
    gpus: list[DiscoveredGpu] = field(default_factory=list)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version integer (12040) as people write it ("12.4")."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def load_pynvml() -> Nvml | None:
    try:
        import pynvml
    except ImportError:
        log.info("nvidia-ml-py is not installed: no GPUs discovered")
        return None
    module: Nvml = pynvml
    return module


def _real_gpus(catalog: Catalog, nvml: Nvml) -> tuple[str | None, str | None, list[DiscoveredGpu]]:
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError, OSError) as exc:
        log.info("NVML is not available (%s): this host has no usable NVIDIA GPUs", exc)
        return None, None, []
    try:
        driver: str | None = None
        cuda: str | None = None
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError as exc:
            log.warning("NVML could not report the driver version: %s", exc)
        try:
            cuda = cuda_version_text(int(nvml.nvmlSystemGetCudaDriverVersion_v2()))
        except nvml.NVMLError as exc:
            log.warning("NVML could not report the CUDA driver version: %s", exc)
        gpus: list[DiscoveredGpu] = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = _text(nvml.nvmlDeviceGetName(handle))
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                memory_mb = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
            except nvml.NVMLError as exc:
                log.warning("GPU %d cannot be read through NVML and is left out: %s", index, exc)
                continue
            model = catalog.match_nvml_name(name, memory_mb)
            if model is None:
                log.warning(
                    "GPU %d (%s, %d MiB) matches no model of the pricing catalog; it is not "
                    "offered until the operator adds a model whose nvml_match fits it",
                    index,
                    name,
                    memory_mb,
                )
            gpus.append(
                DiscoveredGpu(
                    index=index,
                    uuid=uuid,
                    nvml_name=name,
                    model=None if model is None else model.name,
                    memory_mb=memory_mb,
                )
            )
        return driver, cuda, gpus
    except nvml.NVMLError as exc:
        log.warning("NVML failed while listing GPUs (%s): no GPUs discovered", exc)
        return None, None, []
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)


def parse_simulated(catalog: Catalog, simulated: str, first_index: int = 0) -> list[DiscoveredGpu]:
    """GPUs from the operator's "A100-80GB:8,T4:4", indexed from first_index on.

    A simulated GPU's uuid ("SIM-T4-1") counts per model, so it stays the same when the
    number of real GPUs changes.
    """
    gpus: list[DiscoveredGpu] = []
    per_model: Counter[str] = Counter()
    for item in simulated.split(","):
        if not item.strip():
            continue
        try:
            name, count = parse_accelerators(item)
            if count == 0:
                raise InvalidInput("CPU is not a GPU model")
            model = catalog.get(name)
        except InvalidInput as exc:
            raise InvalidInput(
                f"simulated GPUs {simulated!r}: {item.strip()!r}: {exc.message}; "
                "write them as MODEL:COUNT pairs, for example 'A100-80GB:8,T4:4'"
            ) from exc
        if not model.is_gpu:
            raise InvalidInput(
                f"simulated GPUs {simulated!r}: {model.name} is not a GPU model; "
                "write them as MODEL:COUNT pairs, for example 'A100-80GB:8,T4:4'"
            )
        for _ in range(count):
            gpus.append(
                DiscoveredGpu(
                    index=first_index + len(gpus),
                    uuid=f"SIM-{model.name}-{per_model[model.name]}",
                    nvml_name=f"Simulated {model.name}",
                    model=model.name,
                    memory_mb=int(model.memory_gb * 1024),
                    simulated=True,
                )
            )
            per_model[model.name] += 1
    return gpus


def discover(catalog: Catalog, simulated: str = "", nvml: Nvml | None = None) -> Inventory:
    """The GPUs of this host: real ones through NVML, then the simulated ones.

    A host without a driver or without the NVML library is a CPU-only host, not an error.
    nvml is the seam for tests; by default the real `pynvml` module is used.
    Raises InvalidInput when `simulated` names a model the catalog does not have.
    """
    fake = parse_simulated(catalog, simulated)  # a typo fails before NVML is touched
    api = nvml if nvml is not None else load_pynvml()
    driver, cuda, real = (None, None, []) if api is None else _real_gpus(catalog, api)
    first = max((gpu.index for gpu in real), default=-1) + 1
    gpus = real + [replace(gpu, index=first + gpu.index) for gpu in fake]
    return Inventory(driver_version=driver, cuda_version=cuda, gpus=gpus)
