"""What the SDK raises: one base class, each with a message meant for people."""

from __future__ import annotations


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
