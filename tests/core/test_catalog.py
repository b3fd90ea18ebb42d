"""The catalog: default prices, the operator's pricing file, accelerator strings, NVML names."""

from __future__ import annotations

import pytest

from gpulease.core.catalog import load_catalog, parse_accelerators, parse_catalog
from gpulease.core.errors import InvalidInput


def test_defaults_have_the_published_prices() -> None:
    cat = load_catalog(None)
    assert cat.get("T4").hourly_micro == 250_000
    assert cat.get("a100-40gb").hourly_micro == cat.get("A100-80GB").hourly_micro == 900_000
    assert {m.name for m in cat.models} >= {"P100", "V100", "RTX4090", "H100-80GB", "CPU"}
    assert cat.get("CPU").hourly_micro < cat.get("T4").hourly_micro
    assert cat.ncu_reference_hourly_micro == 900_000


def test_nvml_names_map_to_models_by_memory() -> None:
    cat = load_catalog(None)
    assert cat.match_nvml_name("NVIDIA A100-SXM4-80GB", 81920).name == "A100-80GB"  # type: ignore[union-attr]
    assert cat.match_nvml_name("NVIDIA A100-PCIE-40GB", 40960).name == "A100-40GB"  # type: ignore[union-attr]
    assert cat.match_nvml_name("Tesla T4", 15360).name == "T4"  # type: ignore[union-attr]
    assert cat.match_nvml_name("NVIDIA H200", 143771).name == "H200"  # type: ignore[union-attr]
    assert cat.match_nvml_name("Quadro K600", 1024) is None


def test_operator_pricing_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "pricing.yaml"
    path.write_text(
        "currency: {symbol: '¥', name: CNY}\nmodels:\n  - {name: A100-80GB, hourly: '6.5'}\n"
    )
    cat = load_catalog(path)
    assert cat.currency_symbol == "¥" and cat.get("A100-80GB").hourly_micro == 6_500_000


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("models: [", "not valid YAML"),
        ("{}", "models"),
        ("models:\n  - {name: X}", "hourly"),
        ("models:\n  - {name: A100-80GB, hourly: '-1'}", "negative"),
        ("models:\n  - {name: A100-80GB, hourly: 'cheap'}", "models[0].hourly"),
        ("models:\n  - {name: A100-80GB, hourly: 1}\n  - {name: a100-80gb, hourly: 1}", "unique"),
    ],
)
def test_bad_pricing_files_say_where(text: str, words: str) -> None:
    with pytest.raises(InvalidInput, match=words.replace("[", r"\[").replace("]", r"\]")):
        parse_catalog(text)


def test_accelerator_strings() -> None:
    assert parse_accelerators("A100-80GB:4") == ("A100-80GB", 4)
    assert parse_accelerators("T4") == ("T4", 1)
    assert parse_accelerators(None) == ("CPU", 0)
    assert parse_accelerators("cpu") == ("CPU", 0)
    for bad in ("T4:0", "T4:-1", "T4:two", ":1"):
        with pytest.raises(InvalidInput):
            parse_accelerators(bad)


def test_a_gpu_count_is_ascii_digits_and_at_most_1024() -> None:
    from gpulease.core.catalog import MAX_GPU_COUNT, parse_accelerators

    assert parse_accelerators(f"T4:{MAX_GPU_COUNT}") == ("T4", MAX_GPU_COUNT)
    for text in (f"T4:{MAX_GPU_COUNT + 1}", "T4:18446744073709551616", "T4:٣", "T4:²"):
        with pytest.raises(InvalidInput, match="T4"):
            parse_accelerators(text)
