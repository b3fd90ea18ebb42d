"""A run's live event stream (logs, metric points, status): SSE with ids, decoded and typed."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pydantic import ValidationError

from gpulease.client.logstream import EndEvent, LogEvent, StatusEvent, StreamProtocolError
from gpulease.schemas.metrics import MetricPointPublic
from gpulease.schemas.runs import LogChunkPublic, RunPublic

START = "-1:0"
"""The stream position before everything: every log chunk and metric point."""


@dataclass(frozen=True)
class MetricEvent:
    """Metric points stored since the previous event, in the order they were stored."""

    points: list[MetricPointPublic]


RunStreamEvent = LogEvent | MetricEvent | StatusEvent | EndEvent


@dataclass(frozen=True)
class SseEvent:
    id: str | None
    event: str
    data: str


def parse_sse_events(lines: Iterable[str]) -> Iterator[SseEvent]:
    """Server-sent events with their ids, from text lines (without line ends). A message is
    only complete at its blank line, so one cut off by a dropped connection is never used."""
    event: str = "message"
    event_id: str | None = None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield SseEvent(event_id, event, "\n".join(data))
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


def decode_run_event(message: SseEvent) -> RunStreamEvent | None:
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
