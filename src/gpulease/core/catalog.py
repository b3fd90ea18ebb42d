"""The GPU catalog: models, memory, NCU factors and prices, from the operator's pricing file."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

from gpulease.core.errors import InvalidInput
from gpulease.core.money import MoneyError, parse_credits

CPU_MODEL = "CPU"


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_gb: float
    peak_tflops: float
    ncu_factor: Decimal
    hourly_micro: int
    nvml_match: tuple[str, ...]
    is_gpu: bool = True
    daily_micro: int = 0  # one 24-hour prepaid block of one GPU
    spot_hourly_micro: int = 0
    # The CPU and memory share that comes with one GPU (for CPU: one CPU-only instance);
    # None: the node's cores and memory divided by its GPUs (share_per_gpu).
    vcpus: float | None = None
    ram_gb: float | None = None

    def share_per_gpu(
        self, node_cpus: int, node_memory_mb: int, node_gpus: int
    ) -> tuple[float, float]:
        """(vCPUs, RAM GB) one GPU of this model gets on a node (a CPU-only instance's for
        CPU): the pricing file's figures, else the node's cores and memory over its GPUs
        (a CPU-only instance: 2 vCPUs, 8 GB); never more than the node has."""
        node_ram = node_memory_mb / 1024
        if self.is_gpu and node_gpus:
            vcpus = self.vcpus if self.vcpus is not None else node_cpus / node_gpus
            ram = self.ram_gb if self.ram_gb is not None else node_ram / node_gpus
        else:
            vcpus = self.vcpus if self.vcpus is not None else 2.0
            ram = self.ram_gb if self.ram_gb is not None else 8.0
        return (min(vcpus, node_cpus or vcpus), min(ram, node_ram or ram))


@dataclass(frozen=True)
class Catalog:
    models: tuple[GpuModel, ...]
    currency_symbol: str
    currency_name: str
    ncu_reference: str

    def get(self, name: str) -> GpuModel:
        for model in self.models:
            if model.name.lower() == name.lower():
                return model
        known = ", ".join(m.name for m in self.models)
        raise InvalidInput(f"unknown GPU model {name!r}; the catalog has: {known}")

    @property
    def ncu_reference_hourly_micro(self) -> int:
        return self.get(self.ncu_reference).hourly_micro

    def match_nvml_name(self, nvml_name: str, memory_mb: int) -> GpuModel | None:
        """The catalog model for a GPU as NVML names it ('NVIDIA A100-SXM4-80GB', 81920 MiB).

        Several models may share a pattern (A100 40 GB and 80 GB); the closest memory wins.
        """
        candidates = [
            m
            for m in self.models
            if m.is_gpu and any(p.lower() in nvml_name.lower() for p in m.nvml_match)
        ]
        if not candidates:
            return None
        memory_gb = memory_mb / 1024
        return min(candidates, key=lambda m: abs(m.memory_gb - memory_gb))


def share_text(vcpus: float, ram_gb: float) -> str:
    """'12 vCPU, 60 GB RAM': a CPU and memory share as the CLI and the console show it."""
    return f"{vcpus:.3g} vCPU, {ram_gb:.3g} GB RAM"


DEFAULT_PRICING = "pricing.yaml"


def default_pricing_text() -> str:
    return resources.files("gpulease.core").joinpath(DEFAULT_PRICING).read_text()


def _price(raw: Any, where: str) -> int:
    try:
        micro = parse_credits(str(raw))
    except MoneyError as exc:
        raise InvalidInput(f"pricing file: {where}: {exc}") from exc
    if micro < 0:
        raise InvalidInput(f"pricing file: {where}: a price cannot be negative")
    return micro


def _size(raw: Any, where: str) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1
    if isinstance(raw, bool) or not 0 < value < 1e6:
        raise InvalidInput(f"pricing file: {where}: write a positive number, e.g. 8")
    return value


def parse_catalog(text: str) -> Catalog:
    """Parse a pricing file. Every mistake is reported with where it is."""
    import yaml  # here, not at import: the CLI loads this module for its checks alone

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"pricing file is not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise InvalidInput("pricing file needs a 'models:' list")
    daily_hours = Decimal(str(data.get("daily_hours", 20)))
    spot_discount = Decimal(str(data.get("spot_discount", "0.40")))
    if not 0 < daily_hours <= 24:
        raise InvalidInput("pricing file: daily_hours must be above 0 and at most 24")
    if not 0 <= spot_discount < 1:
        raise InvalidInput("pricing file: spot_discount must be at least 0 and below 1")

    def plans(raw: dict[str, Any], hourly: int, where: str) -> tuple[int, int]:
        """(daily block price, spot hourly price) of one GPU."""
        daily, spot = raw.get("daily"), raw.get("spot")
        return (
            _price(daily, f"{where}.daily") if daily is not None else int(hourly * daily_hours),
            _price(spot, f"{where}.spot")
            if spot is not None
            else int(hourly * (1 - spot_discount)),
        )

    models: list[GpuModel] = []
    for i, raw in enumerate(data["models"]):
        where = f"models[{i}]"
        if not isinstance(raw, dict) or "name" not in raw or "hourly" not in raw:
            raise InvalidInput(f"pricing file: {where} needs at least name and hourly")
        hourly = _price(raw["hourly"], f"{where}.hourly")
        daily_price, spot_price = plans(raw, hourly, where)
        models.append(
            GpuModel(
                name=str(raw["name"]),
                memory_gb=float(raw.get("memory_gb", 0)),
                peak_tflops=float(raw.get("peak_tflops", 0)),
                ncu_factor=Decimal(str(raw.get("ncu_factor", 0))),
                hourly_micro=hourly,
                nvml_match=tuple(str(p) for p in raw.get("nvml_match", [raw["name"]])),
                daily_micro=daily_price,
                spot_hourly_micro=spot_price,
                vcpus=_size(raw.get("vcpus"), f"{where}.vcpus"),
                ram_gb=_size(raw.get("ram_gb"), f"{where}.ram_gb"),
            )
        )
    cpu = data.get("cpu") or {}
    cpu_hourly = _price(cpu.get("hourly", "0.02"), "cpu.hourly")
    cpu_daily, cpu_spot = plans(cpu, cpu_hourly, "cpu")
    models.append(
        GpuModel(
            name=str(cpu.get("name", CPU_MODEL)),
            memory_gb=0,
            peak_tflops=0,
            ncu_factor=Decimal(0),
            hourly_micro=cpu_hourly,
            nvml_match=(),
            is_gpu=False,
            daily_micro=cpu_daily,
            spot_hourly_micro=cpu_spot,
            vcpus=_size(cpu.get("vcpus"), "cpu.vcpus"),
            ram_gb=_size(cpu.get("ram_gb"), "cpu.ram_gb"),
        )
    )
    names = [m.name.lower() for m in models]
    if len(set(names)) != len(names):
        raise InvalidInput("pricing file: model names must be unique")
    currency = data.get("currency") or {}
    catalog = Catalog(
        models=tuple(models),
        currency_symbol=str(currency.get("symbol", "$")),
        currency_name=str(currency.get("name", "USD")),
        ncu_reference=str(data.get("ncu_reference", "A100-80GB")),
    )
    catalog.get(catalog.ncu_reference)  # must exist
    return catalog


def load_catalog(path: Path | None) -> Catalog:
    """The operator's pricing file if there is one, else the defaults shipped with gpulease."""
    if path is not None and path.exists():
        return parse_catalog(path.read_text())
    return parse_catalog(default_pricing_text())


MAX_GPU_COUNT = 1024  # more than any one node or cluster here holds; larger is a typo


def parse_accelerators(text: str | None) -> tuple[str, int]:
    """'A100-80GB:4' -> ('A100-80GB', 4); 'T4' -> ('T4', 1); None/'' / 'CPU' -> ('CPU', 0).

    Counts must be positive integers: 0 or negative means a typo, not CPU mode.
    """
    if text is None or not text.strip() or text.strip().lower() in {"cpu", "none"}:
        return CPU_MODEL, 0
    name, sep, count_text = text.strip().partition(":")
    if not name:
        raise InvalidInput(f"{text!r}: write the GPU as MODEL:COUNT, for example T4:1")
    if not sep:
        return name, 1
    try:
        if not count_text.isascii():  # int() would read '٣' as 3
            raise ValueError(count_text)
        count = int(count_text)
    except ValueError:
        raise InvalidInput(
            f"{text!r}: the GPU count must be a whole number, for example {name}:1"
        ) from None
    if count < 1:
        raise InvalidInput(
            f"{text!r}: the GPU count must be at least 1; for a CPU-only instance leave --gpu out"
        )
    if count > MAX_GPU_COUNT:
        raise InvalidInput(f"{text!r}: ask for at most {MAX_GPU_COUNT} GPUs, e.g. {name}:8")
    return name, count
