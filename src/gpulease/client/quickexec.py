"""`POST /instances/{ref}/exec` over the standard library alone, for the CLI's quick path.

httpx and pydantic take several times longer to import than Python takes to start, so the
CLI's `gpulease exec` (cli/entry.py) makes its one request with client/http11.py (a socket,
and the ssl module only for an https server) and reads the answer's events as JSON. It is
the request RunsAPI.exec (client/runs.py) makes; whatever this module does not do (proxies,
resuming a broken answer, explaining a failed run) the CLI hands over to the SDK, given the
run this request created.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit

from gpulease.client.config import TrustedCertificate, normalize_server_url
from gpulease.client.errors import ApiError, ClientError, ServerUnreachable, refusal_text
from gpulease.client.http11 import Answer, HttpError, exchange
from gpulease.client.sse import SseMessage, parse_sse
from gpulease.client.trust import (
    CertificateChanged,
    UntrustedCertificate,
    certificate_problem,
    changed_message,
    untrusted_message,
)

# The variables with which httpx would send the request through a proxy: then the SDK does.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")
CONNECT_TIMEOUT_S = 30.0
# The server sends a keep-alive comment on an idle stream every ~15 s.
READ_TIMEOUT_S = 60.0
REFUSAL_BYTES = 64 * 1024  # of a refusal's body, read for its message


class Declined(Exception):
    """This request is the SDK's to make (a proxy is configured, for one); nothing was sent."""


class QuickExec(NamedTuple):
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
    url, answer = _send(server_url, token, trusted, "POST", path, body, "text/event-stream")
    answer.sock.settimeout(READ_TIMEOUT_S)
    messages = parse_sse(_lines(answer))
    first = next(messages, None)
    try:
        if first is None or first.event != "run":
            raise ValueError("the answer did not start with its run")
        started = json.loads(first.data)
        int(started["run"]["id"])
        str(started["instance_status"])
    except (ValueError, KeyError, TypeError) as exc:
        answer.close()
        raise _unexpected(url, path, exc) from exc
    return QuickExec(started, first.data, messages)


def open_stream(
    server_url: str, token: str, trusted: TrustedCertificate | None, path: str
) -> Iterator[SseMessage]:
    """GET path (from /api/v1 on) as an event stream: its events as they come, until it
    ends or breaks. Raises as open_exec does before the first event."""
    _, answer = _send(
        server_url, token, trusted, "GET", f"/api/v1{path}", None, "text/event-stream"
    )
    answer.sock.settimeout(READ_TIMEOUT_S)
    return parse_sse(_lines(answer))


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
    url, answer = _send(server_url, token, trusted, method, f"/api/v1{path}", body)
    try:
        found = json.loads(answer.read())
        if not isinstance(found, dict):
            raise ValueError("the answer is not a JSON object")
    except (OSError, HttpError, ValueError) as exc:
        raise _unexpected(url, path, exc) from exc
    finally:
        answer.close()
    return found


def _send(
    server_url: str,
    token: str,
    trusted: TrustedCertificate | None,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    accept: str = "application/json",
) -> tuple[str, Answer]:
    """The request sent and its answer's status and headers read: the server's URL and the
    answer; a refusal raises ApiError (the connection closed)."""
    if any(os.environ.get(name) or os.environ.get(name.upper()) for name in PROXY_VARIABLES):
        raise Declined("a proxy is configured")
    url = normalize_server_url(server_url)
    parts = urlsplit(url)
    host = parts.hostname or ""
    headers = {"Authorization": f"Bearer {token}", "Accept": accept}
    payload = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        payload = json.dumps(body).encode()
    sock: socket.socket | None = None
    try:
        sock = socket.create_connection(
            (host, parts.port or (443 if parts.scheme == "https" else 80)), CONNECT_TIMEOUT_S
        )
        if parts.scheme == "https":
            sock = _tls(sock, host, trusted)
        netloc = parts.netloc.rpartition("@")[2]
        answer = exchange(sock, method, netloc, f"{parts.path}{path}", headers, payload)
    except (OSError, HttpError) as exc:
        if sock is not None:
            sock.close()
        raise _unreachable(url, trusted, exc) from exc
    if answer.status >= 400:
        try:
            text = refusal_text(answer.status, answer.reason, answer.read(REFUSAL_BYTES))
        except (OSError, HttpError):
            text = refusal_text(answer.status, answer.reason, b"")
        answer.close()
        raise ApiError(answer.status, text)
    return url, answer


def _tls(sock: socket.socket, host: str, trusted: TrustedCertificate | None) -> socket.socket:
    """sock wrapped in TLS: the pinned certificate alone when there is one, else the
    authorities httpx trusts (trust.ca_context)."""
    from gpulease.client.trust import ca_context, pinned_context

    context = pinned_context(trusted.pem) if trusted is not None else ca_context()
    return context.wrap_socket(sock, server_hostname=host)


def _unexpected(url: str, path: str, exc: BaseException) -> ClientError:
    return ClientError(
        f"unexpected answer from {url} to {path} ({exc}); "
        "is it a gpulease server of a matching version?"
    )


def _lines(answer: Answer) -> Iterator[str]:
    """The answer's text lines without their ends, until it ends or the connection breaks;
    the connection is closed after."""
    try:
        while line := answer.readline():
            yield line.decode("utf-8", "replace").rstrip("\r\n")
    except (OSError, HttpError):
        return  # the caller sees that the run's end never came
    finally:
        answer.close()


def _unreachable(url: str, trusted: TrustedCertificate | None, exc: BaseException) -> ClientError:
    """The SDK's error for a request that got no answer (Transport.transport_error)."""
    if certificate_problem(exc) is not None:
        if trusted is not None:
            return CertificateChanged(changed_message(url, trusted.fingerprint))
        return UntrustedCertificate(untrusted_message(url))
    if isinstance(exc, TimeoutError):
        return ServerUnreachable(url, f"no answer within {CONNECT_TIMEOUT_S:g} s")
    if "ssl" in sys.modules:  # loaded for an https server only
        import ssl

        if isinstance(exc, ssl.SSLError):
            return ServerUnreachable(url, f"TLS failed: {exc}")
    return ServerUnreachable(url, str(exc) or type(exc).__name__)
