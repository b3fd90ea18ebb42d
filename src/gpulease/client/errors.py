"""What the SDK raises: one base class, each with a message meant for people."""

from __future__ import annotations

import json


class ClientError(Exception):
    """Base of every error the SDK raises; `message` is ready to show to a person."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ApiError(ClientError):
    """The server refused a request: `status` is the HTTP status, `message` its detail text."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r})"


class ServerUnreachable(ClientError):
    """No answer from the server: it is down, the URL is wrong, or the network is."""

    def __init__(self, server_url: str, reason: str) -> None:
        super().__init__(f"cannot reach the gpulease server at {server_url}: {reason}")
        self.server_url = server_url
        self.reason = reason


class NotLoggedIn(ClientError):
    """No saved login and no GPULEASE_SERVER / GPULEASE_TOKEN to fall back on."""


class WorkdirError(ClientError):
    """A workdir that cannot be packed: missing, too big, or with a link leading outside."""


def refusal_text(status: int, reason: str, body: bytes) -> str:
    """What to tell a person about a 4xx/5xx answer: the server's `detail` when its JSON
    body has one, else the status in words."""
    detail: str | None = None
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and "detail" in parsed:
        raw = parsed["detail"]
        detail = raw if isinstance(raw, str) else json.dumps(raw)
    if detail:
        return detail
    text = f"{status} {reason}".strip()
    if status >= 500:
        return f"the server failed ({text}); the server's log has the cause"
    return f"the server refused the request ({text})"
