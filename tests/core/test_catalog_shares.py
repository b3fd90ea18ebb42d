"""The pricing file's CPU and memory share per GPU, and the node-derived default."""

from __future__ import annotations

import pytest

from gpulease.core.catalog import default_pricing_text, parse_catalog
from gpulease.core.errors import InvalidInput


def test_vcpus_and_ram_per_gpu_from_the_pricing_file_or_the_node() -> None:
    text = default_pricing_text().replace(
        "  - name: T4\n", "  - name: T4\n    vcpus: 4\n    ram_gb: 30\n"
    )
    catalog = parse_catalog(text)
    t4, v100, cpu = catalog.get("T4"), catalog.get("V100"), catalog.get("CPU")
    assert (t4.vcpus, t4.ram_gb) == (4.0, 30.0)
    assert t4.share_per_gpu(node_cpus=64, node_memory_mb=512 * 1024, node_gpus=8) == (4, 30)
    # left out: the node's cores and memory over its GPUs
    assert v100.vcpus is None
    assert v100.share_per_gpu(node_cpus=64, node_memory_mb=512 * 1024, node_gpus=8) == (8, 64)
    # the shipped CPU-only size, never more than a small node has
    assert cpu.share_per_gpu(node_cpus=64, node_memory_mb=512 * 1024, node_gpus=8) == (2, 8)
    assert cpu.share_per_gpu(node_cpus=1, node_memory_mb=4 * 1024, node_gpus=0) == (1, 4)


@pytest.mark.parametrize("value", ["-1", "lots", "0", "true"])
def test_bad_sizes_are_refused_with_where_they_are(value: str) -> None:
    text = default_pricing_text().replace("  - name: T4\n", f"  - name: T4\n    vcpus: {value}\n")
    with pytest.raises(InvalidInput, match=r"models\[0\]\.vcpus: write a positive number"):
        parse_catalog(text)
