"""The CUDA/driver table and the template check, as pure functions."""

from __future__ import annotations

import pytest

from gpulease.core.templates import BUILTIN_TEMPLATES, get_template
from gpulease.envs.compat import (
    FULL_SUPPORT_DRIVER,
    NodeFacts,
    check,
    compatible_templates,
    driver_runs,
    newest_cuda,
    note,
    requirement,
    version_tuple,
)


def node(driver: str | None, simulated: int = 0) -> NodeFacts:
    return NodeFacts("n1", driver, real_gpus=0 if driver is None else 8, simulated_gpus=simulated)


def test_the_table_covers_cuda_11_8_to_13_0() -> None:
    for cuda in ("11.8", "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8"):
        assert cuda in FULL_SUPPORT_DRIVER
    assert FULL_SUPPORT_DRIVER["12.9"] == "575.51.03"
    assert FULL_SUPPORT_DRIVER["13.0"] == "580.65.06"
    assert FULL_SUPPORT_DRIVER["12.2"] == "535.54.03"


@pytest.mark.parametrize(
    ("driver", "cuda", "runs"),
    [
        ("580.65.06", "13.0", True),
        ("580.95.05", "13.0", True),
        ("575.57.08", "13.0", False),
        ("535.104.05", "13.0", False),
        ("535.104.05", "12.6", True),  # minor-version compatibility within 12.x
        ("525.60.13", "12.9", True),
        ("525.60.12", "12.0", False),
        ("470.82.01", "11.8", True),
        ("450.80.02", "11.8", True),
        ("418.39", "11.8", False),
        ("600.10", "14.0", False),  # unknown CUDA major: never guessed
    ],
)
def test_driver_runs(driver: str, cuda: str, runs: bool) -> None:
    assert driver_runs(driver, cuda) is runs


def test_version_tuples_compare_numerically() -> None:
    assert version_tuple("535.104.05") == (535, 104, 5)
    assert version_tuple("535.104.05") > version_tuple("535.54.03")
    assert version_tuple("580") < version_tuple("580.65.06")


def test_requirement_and_newest_cuda() -> None:
    needed = requirement("12.6")
    assert needed is not None
    assert (needed.minimum, needed.full) == ("525.60.13", "560.28.03")
    assert requirement("12.7") is not None and requirement("12.7").full is None  # type: ignore[union-attr]
    assert requirement("9.0") is None
    assert newest_cuda("535.104.05") == "12.2"
    assert newest_cuda("580.82.07") == "13.0"
    assert newest_cuda("400.1") is None


def test_check_gives_the_reason_people_read() -> None:
    cu130 = get_template("pytorch-cu130")
    assert check(cu130, node("535.104.05")) == (
        "PyTorch 2.14 cu130 needs driver 580 or newer; this node has 535.104.05"
    )
    assert check(cu130, node("580.65.06")) is None
    assert check(get_template("pytorch-cu126"), node("535.104.05")) is None


def test_cpu_templates_and_cpu_instances_run_anywhere() -> None:
    old = node("470.82.01")
    assert check(get_template("python"), old) is None
    assert check(get_template("pytorch-cpu"), old) is None
    assert check(get_template("jax"), old) is None
    assert check(get_template("pytorch-cu130"), old, gpus=False) is None


def test_cuda_templates_run_in_cpu_mode_on_nodes_without_a_driver() -> None:
    cu130 = get_template("pytorch-cu130")
    assert check(cu130, node(None)) is None
    assert "runs on the CPU" in (note(cu130, node(None)) or "")
    assert "simulated GPUs only" in (note(cu130, node(None, simulated=2)) or "")


def test_note_mentions_minor_version_compatibility() -> None:
    text = note(get_template("pytorch-cu126"), node("535.104.05")) or ""
    assert "minor-version compatibility" in text and "560.28.03" in text
    assert note(get_template("pytorch-cu126"), node("560.35.03")) is None


def test_compatible_templates_for_an_old_driver() -> None:
    names = [t.name for t in compatible_templates(list(BUILTIN_TEMPLATES), "535.104.05")]
    assert "pytorch-cu126" in names and "pytorch-cu130" not in names
    assert compatible_templates(list(BUILTIN_TEMPLATES), None) == []
