"""The run-log event stream: server-sent events decoded into typed log, status and end events."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pydantic import ValidationError

from gpulease.schemas.runs import LogChunkPublic, RunPublic


@dataclass(frozen=True)
class LogEvent:
    """One chunk of the run's output; `chunk.seq` counts from 0 without gaps."""

    chunk: LogChunkPublic


@dataclass(frozen=True)
class StatusEvent:
    """The run changed status (pending, running, succeeded, failed)."""

    run: RunPublic


@dataclass(frozen=True)
class EndEvent:
    """The run is over and every chunk of its output was sent: the last event of a stream."""

    status: str
    exit_code: int | None


LogStreamEvent = LogEvent | StatusEvent | EndEvent


@dataclass(frozen=True)
class SseMessage:
    event: str
    data: str


class StreamProtocolError(ValueError):
    """An event whose data is not what the log stream promises."""


def parse_sse(lines: Iterable[str]) -> Iterator[SseMessage]:
    """Server-sent events from text lines (without line ends). A message is only complete at
    its blank line, so one cut off by a dropped connection is never half-delivered."""
    event = "message"
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield SseMessage(event, "\n".join(data))
            event, data = "message", []
        elif line.startswith(":"):
            continue  # a comment: the server's keep-alive
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)


def decode_event(message: SseMessage) -> LogStreamEvent | None:
    """The typed event for a message; None for event kinds this client does not know."""
    try:
        if message.event == "log":
            return LogEvent(LogChunkPublic.model_validate_json(message.data))
        if message.event == "status":
            return StatusEvent(RunPublic.model_validate_json(message.data))
        if message.event == "end":
            body = json.loads(message.data)
            code = body.get("exit_code")
            exit_code = None if code is None else int(code)
            return EndEvent(status=str(body["status"]), exit_code=exit_code)
    except (ValidationError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StreamProtocolError(f"malformed {message.event!r} event from the server") from exc
    return None
