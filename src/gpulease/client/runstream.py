"""A run's live event stream (logs, metric points, status): SSE with ids, decoded and typed."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError

from gpulease.client.base import StreamProtocolError
from gpulease.client.sse import SseMessage
from gpulease.schemas.metrics import MetricPointPublic
from gpulease.schemas.runs import ExecStarted, LogChunkPublic, RunPublic

START = "-1:0"
"""The stream position before everything: every log chunk and metric point."""


def position(log_seq: int = -1, point_id: int = 0) -> str:
    """The stream position after log chunk `log_seq` and metric point `point_id`."""
    return f"{int(log_seq)}:{int(point_id)}"


@dataclass(frozen=True)
class LogEvent:
    """One chunk of the run's output; `chunk.seq` counts from 0 without gaps."""

    chunk: LogChunkPublic


@dataclass(frozen=True)
class MetricEvent:
    """Metric points stored since the previous event, in the order they were stored."""

    points: list[MetricPointPublic]


@dataclass(frozen=True)
class StatusEvent:
    """The run changed status (pending, running, succeeded, failed)."""

    run: RunPublic


@dataclass(frozen=True)
class EndEvent:
    """The run is over and everything it logged and reported was sent: the last event."""

    status: str
    exit_code: int | None


RunStreamEvent = LogEvent | MetricEvent | StatusEvent | EndEvent


@dataclass(frozen=True)
class ExecEvent:
    """The first event of an exec (RunsAPI.exec): the run it created, and its instance's
    status then."""

    started: ExecStarted


class Follower:
    """Where a client is in one run's event stream: the position to resume from (the last
    event id) and what it already got, so that events a reconnect repeats (the current
    status, a chunk delivered before) are passed over."""

    def __init__(self, since: str = START) -> None:
        self.cursor = since
        self.seen_seq = log_seq_of(since)
        self.last_status: str | None = None

    def take(self, message: SseMessage) -> RunStreamEvent | None:
        """The message's event, or None for one to pass over."""
        event = decode_event(message)
        if message.id is not None:
            self.cursor = message.id
        if isinstance(event, LogEvent):
            if event.chunk.seq <= self.seen_seq:
                return None
            self.seen_seq = event.chunk.seq
        elif isinstance(event, StatusEvent):
            if event.run.status == self.last_status:
                return None
            self.last_status = event.run.status
        return event


def log_seq_of(since: str) -> int:
    """The log part of a stream position (the server refuses a malformed one)."""
    head = since.partition(":")[0].strip()
    return int(head) if head.lstrip("-").isdigit() else -1


def decode_event(message: SseMessage) -> RunStreamEvent | None:
    """The typed event; None for kinds this client does not know."""
    try:
        if message.event == "log":
            return LogEvent(LogChunkPublic.model_validate_json(message.data))
        if message.event == "metric":
            points = json.loads(message.data)["points"]
            return MetricEvent([MetricPointPublic.model_validate(p) for p in points])
        if message.event == "status":
            return StatusEvent(RunPublic.model_validate_json(message.data))
        if message.event == "end":
            body = json.loads(message.data)
            code = body.get("exit_code")
            return EndEvent(
                status=str(body["status"]), exit_code=None if code is None else int(code)
            )
    except (ValidationError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StreamProtocolError(f"malformed {message.event!r} event from the server") from exc
    return None
