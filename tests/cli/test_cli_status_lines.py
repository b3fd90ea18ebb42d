"""The CLI's sentences about an instance, a run's own command, and money read back."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpulease.cli.instances import status_text
from gpulease.cli.output import symbol_of
from gpulease.cli.runs import first_line, own_command
from gpulease.core.money import format_credits
from gpulease.core.taskspec import TaskSpec
from gpulease.schemas.instances import InstancePublic


def instance(status: str, **fields: object) -> InstancePublic:
    values: dict[str, object] = {
        "id": 1,
        "name": "box",
        "status": status,
        "desired_state": "running",
        "status_reason": "",
        "status_message": "",
        "gpu_model": "T4",
        "gpu_count": 1,
        "gpu_indices": [],
        "simulated": True,
        "template": "pytorch",
        "node": None,
        "hourly_micro": 350_000,
        "hourly": "$0.3500",
        "queue_position": None,
        "created_at": datetime(2026, 12, 1, tzinfo=UTC),
        "started_at": None,
    }
    return InstancePublic.model_validate({**values, **fields})


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        (instance("queued", queue_position=1), "queued, being placed on a node"),
        (instance("queued"), "queued, being placed on a node"),
        (instance("queued", queue_position=3), "queued behind 2 other requests"),
        (instance("queued", queue_position=2), "queued behind 1 other request"),
        (
            instance("queued", queue_position=2, status_message="needs 1 × T4, 0 free"),
            "queued: needs 1 × T4, 0 free",
        ),
        (
            instance("starting", status_message="building environment"),
            "starting: building environment",
        ),
        (instance("running"), "running"),
        (instance("released", status_reason="released"), "released"),
        (instance("stopped", status_reason="stopped by its owner"), "stopped by its owner"),
        (instance("released", status_reason="its run 4 ended"), "released: its run 4 ended"),
        (instance("failed", status_reason="runner failed: gone"), "failed: runner failed: gone"),
    ],
)
def test_status_reads_as_a_sentence(shown: InstancePublic, expected: str) -> None:
    assert status_text(shown) == expected


@pytest.mark.parametrize(
    "spec",
    [
        TaskSpec(run="python train.py --lr 'a b'", setup="pip install -r x.txt", skypilot=True),
        TaskSpec(run="echo it's\nexec bash -c 'no' run", skypilot=True),
        TaskSpec(run="python train.py\necho done", setup="pip list\nexit 0", skypilot=False),
        TaskSpec(run="python train.py", skypilot=False),
    ],
)
def test_own_command_is_the_tasks_run_inside_its_wrapper(spec: TaskSpec) -> None:
    assert own_command(spec.script()) == spec.run


def test_a_script_that_is_no_wrapper_is_its_own_command() -> None:
    for script in ("exec bash -c 'a' 'b' run", "make run", "set -e\nmake"):
        assert own_command(script) == script
    assert first_line("python train.py\necho done") == "python train.py…"
    assert first_line("x" * 70, width=10) == "x" * 10 + "…"


@pytest.mark.parametrize("symbol", ["$", "€", "CHF ", ""])
@pytest.mark.parametrize("micro", [0, 1_500_000, -2_250_000])
def test_symbol_of_reads_back_what_format_credits_wrote(symbol: str, micro: int) -> None:
    assert symbol_of(format_credits(micro, symbol), micro) == symbol
    assert symbol_of("12 apples", micro) == ""
