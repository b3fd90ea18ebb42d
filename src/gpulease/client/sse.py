"""Server-sent events read from text lines, with the standard library alone (the CLI's quick
`exec` reads them before, or without, importing the SDK's HTTP stack)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple


class SseMessage(NamedTuple):
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
