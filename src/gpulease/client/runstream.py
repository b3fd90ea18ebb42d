"""A run's live event stream (logs, metric points, status): SSE with ids, decoded and typed."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pydantic import ValidationError

from gpulease.client.base import StreamProtocolError
from gpulease.schemas.metrics import MetricPointPublic
from gpulease.schemas.runs import LogChunkPublic, RunPublic

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
class SseMessage:
    id: str | None
    event: str
    data: str


def parse_sse(lines: Iterable[str]) -> Iterator[SseMessage]:
    """Server-sent events with their ids, from text lines (without line ends). A message is
    only complete at its blank line, so one cut off by a dropped connection is never used."""
    event: str = "message"
    event_id: str | None = None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield SseMessage(event_id, event, "\n".join(data))
            event, event_id, data = "message", None, []
        elif line.startswith(":"):
            continue  # the server's keep-alive
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                event_id = value


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
