"""The SDK's transport: one httpx client, the login token, error mapping and parsing.

Every resource group (client/instances.py, client/runs.py, ...) talks through one
`Transport`; GpuleaseClient (client/api.py) owns it and hands it to each group.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any, TypedDict, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from gpulease.client.bodies import as_pieces
from gpulease.client.config import TrustedCertificate, normalize_server_url
from gpulease.client.errors import ApiError, ClientError, ServerUnreachable, refusal_text
from gpulease.client.trust import (
    CertificateChanged,
    UntrustedCertificate,
    certificate_problem,
    changed_message,
    pinned_context,
    untrusted_message,
)

API_PREFIX = "/api/v1"
# A proxy in front of a restarting server answers these; event streams wait them out.
RETRYABLE_STATUSES = frozenset({502, 503, 504})
# The server sends a keep-alive comment on an idle stream every ~15 s.
STREAM_READ_TIMEOUT_S = 60.0

M = TypeVar("M", bound=BaseModel)
E = TypeVar("E")
InstanceRef = int | str
"""An instance's id or its name."""
ReconnectHook = Callable[[str, float], None]
"""Called before each reconnect of a broken event stream with (why, seconds until the retry)."""
Params = Mapping[str, str | int]


def path_part(ref: InstanceRef) -> str:
    """One path segment: an id or a name, quoted."""
    return quote(str(ref), safe="")


def body_of(model: BaseModel) -> dict[str, Any]:
    """A request body as JSON: only the fields the caller set (the server fills defaults,
    and for partial updates a field left out means "unchanged")."""
    return model.model_dump(mode="json", exclude_unset=True)


def error_from_response(response: httpx.Response) -> ApiError:
    """The ApiError for a 4xx/5xx answer: the server's `detail` text when it sent one."""
    text = refusal_text(response.status_code, response.reason_phrase, response.content)
    return ApiError(response.status_code, text)


class StreamProtocolError(ValueError):
    """An event whose data is not what the event stream promises."""


class _Retryable(Exception):
    """A stream answer worth waiting out (a proxy's 502 while the server restarts)."""


class TransportOptions(TypedDict, total=False):
    """How a Transport (and so a GpuleaseClient) reaches the server; see Transport."""

    http: httpx.Client | None
    transport: httpx.BaseTransport | None
    timeout: float
    trusted: TrustedCertificate | None


class Transport:
    """One gpulease server, as one user (or anonymously): requests, answers, errors.

    `http` lets tests hand in a Starlette TestClient (an httpx.Client) to run against the
    ASGI app in process; the caller keeps owning it. Otherwise the transport makes its own
    httpx.Client (with `transport`, if given) and closes it in close().

    Every refusal raises ApiError(status, the server's message); no answer at all raises
    ServerUnreachable naming the URL; a pinned certificate that changed raises
    CertificateChanged (see client/trust.py).
    """

    def __init__(
        self,
        server_url: str,
        token: str | None = None,
        *,
        http: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 30,
        trusted: TrustedCertificate | None = None,
    ) -> None:
        if http is not None and transport is not None:
            raise ValueError("pass either http or transport, not both")
        self.server_url = normalize_server_url(server_url)
        self.token = token
        self.timeout = timeout
        self.trusted = trusted if self.server_url.startswith("https://") else None
        self._owns_http = http is None
        verify = pinned_context(self.trusted.pem) if self.trusted else True
        self._http = http or httpx.Client(transport=transport, timeout=timeout, verify=verify)

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def url(self, path: str) -> str:
        return f"{self.server_url}{API_PREFIX}{path}"

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if extra:
            headers.update(extra)
        return headers

    def transport_error(self, exc: httpx.TransportError) -> ClientError:
        """A refused certificate, said plainly; otherwise ServerUnreachable."""
        if certificate_problem(exc) is None:
            return self.unreachable(exc)
        if self.trusted is not None:
            return CertificateChanged(changed_message(self.server_url, self.trusted.fingerprint))
        return UntrustedCertificate(untrusted_message(self.server_url))

    def unreachable(self, exc: httpx.TransportError) -> ServerUnreachable:
        if isinstance(exc, httpx.TimeoutException):
            return ServerUnreachable(self.server_url, f"no answer within {self.timeout:g} s")
        return ServerUnreachable(self.server_url, str(exc) or type(exc).__name__)

    def unexpected(self, path: str, exc: Exception) -> ClientError:
        return ClientError(
            f"unexpected answer from {self.server_url} to {path} ({exc}); "
            "is it a gpulease server of a matching version?"
        )

    def send(
        self,
        method: str,
        path: str,
        *,
        body: BaseModel | None = None,
        params: Params | None = None,
        content: Iterator[bytes] | bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        sent = self.headers(headers)
        if isinstance(content, bytes):
            content = as_pieces(content, sent)
        try:
            response = self._http.request(
                method,
                self.url(path),
                json=None if body is None else body_of(body),
                params=params,
                content=content,
                headers=sent,
            )
        except httpx.TransportError as exc:
            raise self.transport_error(exc) from exc
        if response.is_error:
            raise error_from_response(response)
        return response

    def one(self, model: type[M], method: str, path: str, **kwargs: Any) -> M:
        """The answer parsed as `model`."""
        response = self.send(method, path, **kwargs)
        return self.parse(model, path, response.content)

    def parse(self, model: type[M], path: str, text: str | bytes) -> M:
        """JSON from the answer to path, as `model`."""
        try:
            return model.model_validate_json(text)
        except (ValidationError, ValueError) as exc:
            raise self.unexpected(path, exc) from exc

    def post_events(self, path: str, body: BaseModel) -> Iterator[str]:
        """POST body to path and yield the text lines of its event-stream answer, until the
        server ends it or the connection breaks (then the lines just stop: the caller knows
        whether it got everything). A refusal raises ApiError, no answer ServerUnreachable,
        before the first line. Never retried: a POST may have acted already."""
        timeout = httpx.Timeout(self.timeout, read=STREAM_READ_TIMEOUT_S)
        try:
            with self._http.stream(
                "POST",
                self.url(path),
                json=body_of(body),
                headers=self.headers({"Accept": "text/event-stream"}),
                timeout=timeout,
            ) as response:
                if response.is_error:
                    response.read()
                    raise error_from_response(response)
                try:
                    yield from response.iter_lines()
                except httpx.TransportError as exc:
                    if certificate_problem(exc) is not None:
                        raise self.transport_error(exc) from exc
        except httpx.TransportError as exc:
            raise self.transport_error(exc) from exc

    def many(self, model: type[M], path: str, **kwargs: Any) -> list[M]:
        """A GET whose answer is a list of `model`."""
        response = self.send("GET", path, **kwargs)
        try:
            data = response.json()
            if not isinstance(data, list):
                raise ValueError("expected a list")
            return [model.model_validate(item) for item in data]
        except (ValidationError, ValueError) as exc:
            raise self.unexpected(path, exc) from exc

    def csv(self, path: str, params: Params | None = None) -> str:
        """A GET whose answer is CSV text."""
        return self.send("GET", path, params=params, headers={"Accept": "text/csv"}).text

    def resumable_stream(
        self,
        path: str,
        what: str,
        params: Callable[[], Params],
        read: Callable[[Iterator[str]], Iterator[E | None]],
        is_last: Callable[[E], bool],
        *,
        give_up_after: float | None,
        retry_delay: float,
        max_retry_delay: float,
        on_reconnect: ReconnectHook | None,
    ) -> Generator[E, None, None]:
        """GET an event stream and yield what `read` makes of its lines, until is_last.

        `read` yields None for a message it passes over (that still counts as the stream
        working). A dropped connection or a proxy's 502/503/504 is retried with backoff;
        `params()` is asked again for each connection, so `read` moves the resume position.
        ServerUnreachable only after `give_up_after` seconds without a message (None: never).
        """
        delay = retry_delay
        failing_since: float | None = None
        timeout = httpx.Timeout(self.timeout, read=STREAM_READ_TIMEOUT_S)
        while True:
            try:
                with self._http.stream(
                    "GET",
                    self.url(path),
                    params=params(),
                    headers=self.headers({"Accept": "text/event-stream"}),
                    timeout=timeout,
                ) as response:
                    if response.is_error:
                        response.read()
                        error = error_from_response(response)
                        if response.status_code in RETRYABLE_STATUSES:
                            raise _Retryable(error.message)
                        raise error
                    for event in read(response.iter_lines()):
                        failing_since, delay = None, retry_delay
                        if event is None:
                            continue
                        yield event
                        if is_last(event):
                            return
                reason = "the server ended the stream early"
            except httpx.TransportError as exc:
                if certificate_problem(exc) is not None:
                    raise self.transport_error(exc) from exc
                reason = str(self.unreachable(exc).reason)
            except _Retryable as exc:
                reason = str(exc)
            except StreamProtocolError as exc:
                raise self.unexpected(path, exc) from exc
            now = time.monotonic()
            if failing_since is None:
                failing_since = now
            elif give_up_after is not None and now - failing_since > give_up_after:
                raise ServerUnreachable(
                    self.server_url,
                    f"{what} broke ({reason}) and reconnecting has failed for {give_up_after:g} s",
                )
            if on_reconnect is not None:
                on_reconnect(reason, delay)
            time.sleep(delay)
            delay = min(max(delay * 2, retry_delay), max_retry_delay)


class Resource:
    """A group of the API's routes (client.instances, client.runs, ...) over one transport."""

    def __init__(self, api: Transport) -> None:
        self._api = api
