"""The trace simulator: agrees with a naive FIFO written here, and its CLI (small CSVs)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpulease.cli.main import app
from gpulease.scheduler.model import Config
from gpulease.scheduler.policy import POLICIES
from gpulease.scheduler.simulator import simulate
from gpulease.scheduler.traces import Job


def naive_fifo(jobs: list[Job], nodes: int, per_node: int) -> dict[int, float]:
    """Strict first come first served, one job per node, tightest node first, no shortcuts."""
    free = [per_node] * nodes
    ends: list[tuple[float, int, int]] = []  # (end, node, gpus)
    queue: list[Job] = []
    starts: dict[int, float] = {}
    pending = sorted(jobs, key=lambda j: (j.submit, j.id))
    while pending or queue:
        times = [e[0] for e in ends] + ([pending[0].submit] if pending else [])
        now = min(times)
        for e in [e for e in ends if e[0] <= now]:
            free[e[1]] += e[2]
            ends.remove(e)
        while pending and pending[0].submit <= now:
            queue.append(pending.pop(0))
        while queue:
            job = queue[0]
            fits = [(free[n], n) for n in range(nodes) if free[n] >= job.gpus]
            if not fits:
                break
            _, node = min(fits)
            free[node] -= job.gpus
            ends.append((now + job.duration, node, job.gpus))
            starts[job.id] = now
            queue.pop(0)
    return starts


def random_jobs(seed: int, n: int = 120) -> list[Job]:
    rng = random.Random(seed)
    t = 0.0
    jobs = []
    for i in range(n):
        t += rng.choice((0, 5, 30, 60))
        jobs.append(
            Job(i, t, float(rng.randint(1, 900)), rng.choice((1, 1, 2, 4)), rng.choice("ab"))
        )
    return jobs


@pytest.mark.parametrize("seed", range(5))
def test_simulated_fifo_agrees_with_a_naive_fifo(seed: int) -> None:
    jobs = random_jobs(seed)
    result = simulate(jobs, 3, 4, Config("fifo"))
    assert result.first_starts == naive_fifo(jobs, 3, 4)
    assert result.jobs == len(jobs) and result.preemptions == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_finishes_every_job_and_backfill_policies_wait_less(policy: str) -> None:
    jobs = random_jobs(11, 200)
    result = simulate(jobs, 3, 4, Config(policy))
    assert set(result.first_starts) == {j.id for j in jobs}
    assert 0 < result.utilisation <= 1 and 0 < result.fairness <= 1
    assert 0 <= result.eta_within_10min <= 1
    fifo = simulate(jobs, 3, 4, Config("fifo"))
    if policy in ("backfill", "default", "srtf"):
        assert result.avg_queue <= fifo.avg_queue


@pytest.mark.parametrize("policy", ("fifo", "default"))
def test_an_eta_sample_changes_only_the_eta_figures(policy: str) -> None:
    jobs = random_jobs(3, 300)
    full = simulate(jobs, 8, 4, Config(policy))
    part = simulate(jobs, 8, 4, Config(policy), eta_sample=3)
    assert part.first_starts == full.first_starts  # estimates never change a decision
    eta = ("eta_within_10min", "eta_within_25pct", "eta_jobs")
    assert {k: v for k, v in part.figures().items() if k not in eta} == {
        k: v for k, v in full.figures().items() if k not in eta
    }
    assert full.eta_jobs == 300 and part.eta_jobs == 100  # ids 0, 3, 6, …
    # the sample's share is computed over the sample alone
    assert 0 < part.eta_within_10min <= 1
    assert abs(part.eta_within_10min - full.eta_within_10min) < 0.15
    with pytest.raises(ValueError, match="at least 1"):
        simulate(jobs, 8, 4, Config(policy), eta_sample=0)


def write_trace(path: Path, rows: list[str]) -> Path:
    path.write_text("timestamp,duration,num_gpus,cluster\n" + "\n".join(rows) + "\n")
    return path


def test_cli_prints_policies_side_by_side_and_json(tmp_path: Path) -> None:
    rows = [
        f"2017-10-09 07:{i // 60:02d}:{i % 60:02d},{60 + i * 7},{1 + i % 4},vc{i % 3}"
        for i in range(90)
    ]
    trace = write_trace(tmp_path / "t.csv", rows)
    args = [
        "simulate",
        str(trace),
        "--gpus",
        "8",
        "--gpus-per-node",
        "4",
        "--columns",
        "user=cluster",
    ]
    table = CliRunner().invoke(app, [*args, "--policy", "fifo,default"])
    assert table.exit_code == 0, table.output
    assert "fifo" in table.output and "default" in table.output and "JCT, average" in table.output
    out = CliRunner().invoke(app, [*args, "--policy", "backfill,las", "-o", "json"])
    assert out.exit_code == 0, out.output
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [o["policy"] for o in lines] == ["backfill", "las"] and lines[0]["jobs"] == 90
    png = tmp_path / "q.png"
    plotted = CliRunner().invoke(app, [*args, "--policy", "fifo", "--plot", str(png)])
    assert plotted.exit_code == 0, plotted.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("rows", "extra", "words"),
    [
        (["1,10,1,a"], ["--columns", "user=owner"], "no column owner (user)"),
        (["1,10,0,a"], ["--columns", "user=cluster"], "no jobs"),
        (["1,10,1,a"], ["--columns", "user"], "bad column mapping"),
        (["1,10,1,a"], ["--columns", "colour=cluster"], "unknown field 'colour'"),
        (["soon,10,1,a"], ["--columns", "user=cluster"], "neither seconds nor a date-time"),
        (["1,10,1,a"], ["--columns", "user=cluster", "--policy", "lottery"], "unknown policy"),
    ],
)
def test_cli_bad_input_is_a_clear_message_and_exit_2(
    tmp_path: Path, rows: list[str], extra: list[str], words: str
) -> None:
    trace = write_trace(tmp_path / "t.csv", rows)
    result = CliRunner().invoke(app, ["simulate", str(trace), "--gpus", "8", *extra])
    assert result.exit_code == 2, result.output
    assert words in result.output.replace("\n", " ")
