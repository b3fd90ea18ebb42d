"""Wire models for sweeps: the request that starts one, and a sweep with its trials."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from gpulease.schemas.base import Model

MAX_NAME = 100


class SweepRange(BaseModel):
    """A parameter drawn from [low, high]: linear, log (uniform in the logarithm) or int."""

    name: str = Field(max_length=32)
    low: float
    high: float
    scale: Literal["linear", "log", "int"] = "linear"


class SweepSpace(BaseModel):
    """What to search. Without `random`: every combination of `grid`. With `random` N: N
    trials, each drawing its ranges and one value of each grid parameter, from `seed` (the
    server picks one when it is left out, and records it)."""

    grid: dict[str, list[str]] = Field(default_factory=dict)
    ranges: list[SweepRange] = Field(default_factory=list, max_length=20)
    random: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)


class SweepTask(BaseModel):
    """The task each trial runs, as `gpulease run` would run it: `run` and `setup` (with
    `${name}` placeholders), its envs, on its own instance of `gpu`."""

    name: str | None = Field(default=None, max_length=MAX_NAME)
    run: str = Field(max_length=100_000)
    setup: str | None = Field(default=None, max_length=100_000)
    envs: dict[str, str] = Field(default_factory=dict)
    # A task file's run (SkyPilot's setup-then-run script and variables), or a bare command.
    skypilot: bool = True
    gpu: str | None = Field(default=None, max_length=80, description="MODEL:COUNT; none = CPU")
    template: str = Field(default="pytorch", max_length=64)
    plan: Literal["on_demand", "spot"] = "on_demand"
    team: str | None = Field(default=None, max_length=64)
    datasets: list[str] = Field(default_factory=list, max_length=32)
    start_when_cheap: bool = False
    # Each trial's instance waits in the queue for a workdir upload (PUT .../workdir).
    awaiting_workdir: bool = False
    # How long one trial may hold its GPUs: its instance stops then; the cost estimate
    # counts it (else what earlier runs of the task took, else the server's minimum start).
    max_runtime_minutes: int | None = Field(default=None, ge=1, le=60 * 24 * 31)


class SweepCreate(BaseModel):
    name: str | None = Field(default=None, max_length=MAX_NAME)
    task: SweepTask
    space: SweepSpace
    metric: str | None = Field(default=None, max_length=64)
    goal: Literal["max", "min"] = "max"
    stop_early: bool = False
    min_steps: int = Field(default=5, ge=1, le=1_000_000)
    min_trials: int = Field(default=2, ge=1, le=1000)


class SweepTrialPublic(Model):
    index: int
    params: dict[str, str]
    instance_id: int
    instance_name: str
    instance_status: str
    run_id: int | None
    run_status: str | None
    # In words: "queued", "running", "succeeded", "failed: exit code 1", "stopped early ...".
    status: str
    stopped_early: bool
    best: float | None  # the best value of the sweep's metric (None: none reported)
    last_step: int | None


class SweepPublic(Model):
    id: int
    name: str | None
    space: dict[str, object]
    metric: str | None
    goal: str
    stop_early: bool
    min_steps: int
    min_trials: int
    estimated_micro: int
    estimated: str
    created_at: datetime
    finished: bool  # every trial has ended
    counts: dict[str, int]  # trials by state: queued, running, succeeded, failed, stopped_early
    best_trial: int | None  # the index of the best trial by the metric
    # Said when the metric cannot name a best trial: "no trial reported val_acc; ...".
    metric_note: str
    keys: list[str]  # every metric key the trials reported
    trials: list[SweepTrialPublic]
