"""`POST /instances/{ref}/exec` over the standard library alone, for the CLI's quick path.

httpx and pydantic take several times longer to import than Python takes to start, so the
CLI's `gpulease exec` (cli/entry.py) makes its one request with http.client and reads the
answer's events as JSON. It is the request RunsAPI.exec (client/runs.py) makes; whatever
this module does not do (proxies, resuming a broken answer, explaining a failed run) the
CLI hands over to the SDK, given the run this request created.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from gpulease.client.config import TrustedCertificate, normalize_server_url
from gpulease.client.errors import ApiError, ClientError, ServerUnreachable, refusal_text
from gpulease.client.sse import SseMessage, parse_sse
from gpulease.client.trust import (
    CertificateChanged,
    UntrustedCertificate,
    ca_context,
    certificate_problem,
    changed_message,
    pinned_context,
    untrusted_message,
)

# The variables with which httpx would send the request through a proxy: then the SDK does.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")
CONNECT_TIMEOUT_S = 30.0
# The server sends a keep-alive comment on an idle stream every ~15 s.
READ_TIMEOUT_S = 60.0


class Declined(Exception):
    """This request is the SDK's to make (a proxy is configured, for one); nothing was sent."""


@dataclass(frozen=True)
class QuickExec:
    """An exec the server accepted: its first event, then the rest as they come."""

    started: dict[str, Any]  # ExecStarted's JSON: {"run": {...}, "instance_status": ...}
    started_json: str
    messages: Iterator[SseMessage]

    @property
    def run_id(self) -> int:
        return int(self.started["run"]["id"])


def open_exec(
    server_url: str,
    token: str,
    trusted: TrustedCertificate | None,
    ref: str,
    body: dict[str, Any],
) -> QuickExec:
    """Send the exec and read up to its first event. A refusal raises ApiError, no answer
    ServerUnreachable, a certificate that is not the pinned or a trusted one
    CertificateChanged or UntrustedCertificate, all before any output; Declined when the
    SDK should send it instead."""
    path = f"/api/v1/instances/{quote(ref, safe='')}/exec"
    url, connection, response = _send(
        server_url, token, trusted, "POST", path, body, "text/event-stream"
    )
    if connection.sock is not None:
        connection.sock.settimeout(READ_TIMEOUT_S)
    messages = parse_sse(_lines(connection, response))
    first = next(messages, None)
    try:
        if first is None or first.event != "run":
            raise ValueError("the answer did not start with its run")
        started = json.loads(first.data)
        int(started["run"]["id"])
        str(started["instance_status"])
    except (ValueError, KeyError, TypeError) as exc:
        connection.close()
        raise _unexpected(url, path, exc) from exc
    return QuickExec(started, first.data, messages)


def open_stream(
    server_url: str, token: str, trusted: TrustedCertificate | None, path: str
) -> Iterator[SseMessage]:
    """GET path (from /api/v1 on) as an event stream: its events as they come, until it
    ends or breaks. Raises as open_exec does before the first event."""
    _, connection, response = _send(
        server_url, token, trusted, "GET", f"/api/v1{path}", None, "text/event-stream"
    )
    if connection.sock is not None:
        connection.sock.settimeout(READ_TIMEOUT_S)
    return parse_sse(_lines(connection, response))


def call_json(
    server_url: str,
    token: str,
    trusted: TrustedCertificate | None,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One API request (path from /api/v1 on) and its JSON object answer; refusals and no
    answer raise as open_exec's do, Declined likewise before anything is sent."""
    url, connection, response = _send(server_url, token, trusted, method, f"/api/v1{path}", body)
    try:
        answer = json.loads(response.read())
        if not isinstance(answer, dict):
            raise ValueError("the answer is not a JSON object")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise _unexpected(url, path, exc) from exc
    finally:
        connection.close()
    return answer


def _send(
    server_url: str,
    token: str,
    trusted: TrustedCertificate | None,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    accept: str = "application/json",
) -> tuple[str, http.client.HTTPConnection, http.client.HTTPResponse]:
    """The request sent and its answer's status and headers read: the server's URL, the
    connection and the answer; a refusal raises ApiError (the connection closed)."""
    if any(os.environ.get(name) or os.environ.get(name.upper()) for name in PROXY_VARIABLES):
        raise Declined("a proxy is configured")
    url = normalize_server_url(server_url)
    parts = urlsplit(url)
    host = parts.hostname or ""
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        context = pinned_context(trusted.pem) if trusted is not None else ca_context()
        connection = http.client.HTTPSConnection(
            host, parts.port or 443, timeout=CONNECT_TIMEOUT_S, context=context
        )
    else:
        connection = http.client.HTTPConnection(host, parts.port or 80, timeout=CONNECT_TIMEOUT_S)
    headers = {"Authorization": f"Bearer {token}", "Accept": accept}
    payload = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        payload = json.dumps(body).encode()
    try:
        connection.request(method, f"{parts.path}{path}", body=payload, headers=headers)
        response = connection.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise _unreachable(url, trusted, exc) from exc
    if response.status >= 400:
        text = refusal_text(response.status, response.reason, response.read())
        connection.close()
        raise ApiError(response.status, text)
    return url, connection, response


def _unexpected(url: str, path: str, exc: BaseException) -> ClientError:
    return ClientError(
        f"unexpected answer from {url} to {path} ({exc}); "
        "is it a gpulease server of a matching version?"
    )


def _lines(
    connection: http.client.HTTPConnection, response: http.client.HTTPResponse
) -> Iterator[str]:
    """The answer's text lines without their ends, until it ends or the connection breaks;
    the connection is closed after."""
    try:
        while line := response.readline():
            yield line.decode("utf-8", "replace").rstrip("\r\n")
    except (OSError, http.client.HTTPException):
        return  # the caller sees that the run's end never came
    finally:
        connection.close()


def _unreachable(url: str, trusted: TrustedCertificate | None, exc: BaseException) -> ClientError:
    """The SDK's error for a request that got no answer (Transport.transport_error)."""
    if certificate_problem(exc) is not None:
        if trusted is not None:
            return CertificateChanged(changed_message(url, trusted.fingerprint))
        return UntrustedCertificate(untrusted_message(url))
    if isinstance(exc, TimeoutError):
        return ServerUnreachable(url, f"no answer within {CONNECT_TIMEOUT_S:g} s")
    if isinstance(exc, ssl.SSLError):
        return ServerUnreachable(url, f"TLS failed: {exc}")
    return ServerUnreachable(url, str(exc) or type(exc).__name__)
