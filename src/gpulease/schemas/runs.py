"""Wire models for runs and their log chunks."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from gpulease.schemas.base import Model

if TYPE_CHECKING:
    from gpulease.core.taskspec import TaskSpec


class RunCreate(BaseModel):
    command: str
    task_name: str | None = None  # a task file's `name:`, shown beside the run
    env: dict[str, str] = Field(default_factory=dict)
    stop_instance_on_exit: bool = False

    @classmethod
    def of_task(cls, spec: TaskSpec) -> RunCreate:
        """A task file's run: its setup and run script, name and envs; the instance stops
        when it exits (`gpulease run` releases it then)."""
        return cls(
            command=spec.script(), task_name=spec.name, env=spec.envs, stop_instance_on_exit=True
        )


class RunPublic(Model):
    id: int
    instance_id: int
    command: str
    task_name: str | None = None
    status: str
    status_reason: str
    exit_code: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class LogChunkPublic(Model):
    seq: int
    stream: str
    data: str
    time: datetime


class LogPage(BaseModel):
    run: RunPublic
    chunks: list[LogChunkPublic]
    next_after: int


class ExecStarted(BaseModel):
    """The first event of `POST /instances/{ref}/exec`: the run it created, and the status
    of its instance then (a queued or starting one runs it once it is running)."""

    run: RunPublic
    instance_status: str
