"""The runner's HTTP conversation with the server: bearer token, retries with backoff.

The runner reaches a server on its own node through the server's Unix socket
(RunnerSpec.server_socket), never its TCP port, and replaces the launch secret of its spec
with a session token of its own at start and whenever the server comes back
(open_session), so that neither a listener a job put on the port nor a token that leaked
earlier can speak for it.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from gpulease.client.bodies import as_pieces
from gpulease.client.trust import pinned_context
from gpulease.schemas.runner import RUNNER_API, SESSION_TOKEN_PREFIX, RunnerSession

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 5.0
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class ServerGone(Exception):
    """401: the server does not know the token any more; the instance was released."""


class Unreachable(Exception):
    """A single attempt (retry=False) found no answer from the server."""


class Aborted(Exception):
    """Retrying was given up because the caller's abort event was set."""


def new_session_token() -> str:
    return SESSION_TOKEN_PREFIX + secrets.token_urlsafe(32)


def tls_verify(server_url: str, server_certificate: str | None) -> ssl.SSLContext | bool:
    """How the runner checks the server's certificate: an https server with a self-signed
    one is trusted for exactly that one (the spec carries it), another https server is
    verified as usual. A plain http URL has no certificate to check: False spares the
    runner's start loading the default CA bundle (about 30 ms) for a context never used (no
    redirect is followed, so nothing leads the runner to https unchecked)."""
    if server_certificate:
        return pinned_context(server_certificate)
    return not server_url.startswith("http://")


class Connection:
    """Calls under spec.server_url with the instance's token.

    With retry (the default) a call is repeated on network errors and 5xx, waiting 0.2 s
    doubling to 5 s, until it gets an answer: every runner call is idempotent. A 401 sets
    `gone`, calls on_stop and raises ServerGone (also in every later call); a 409 calls
    on_stop and is returned to the caller. Other 4xx are logged and returned. A call that
    went out with a token open_session has replaced since is asked again with the new one.

    server_socket: the server's Unix socket on this node; every request goes there (the URL
    only names the scheme, Host and TLS name), so nothing listening on the TCP port ever
    hears from this runner.
    """

    def __init__(
        self,
        server_url: str,
        token: str,
        *,
        on_stop: Callable[[str], None],
        transport: httpx.BaseTransport | None = None,
        backoff_start_s: float = BACKOFF_START_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        server_certificate: str | None = None,
        server_socket: Path | None = None,
    ) -> None:
        verify = tls_verify(server_url, server_certificate)
        if transport is None and server_socket is not None:
            transport = httpx.HTTPTransport(uds=str(server_socket), verify=verify)
        self._client = httpx.Client(
            base_url=server_url, transport=transport, timeout=30.0, verify=verify
        )
        self._token = token
        self._rotation = threading.Lock()  # held while open_session replaces the token
        self._on_stop = on_stop
        self._backoff_start = backoff_start_s
        self._backoff_max = backoff_max_s
        self.gone = threading.Event()

    def close(self) -> None:
        self._client.close()

    @property
    def token(self) -> str:
        """The token calls carry now (streams use it too)."""
        return self._token

    def open_session(self, *, abort: threading.Event | None = None) -> None:
        """Replace the token with a new one that only this process knows (POST /session):
        the token it had stops working on the server. Retries like call(); a 401 for the
        old token may mean the server took the new one but its answer got lost, so the new
        one is tried once before the server counts as gone."""
        path = f"{RUNNER_API}/session"
        with self._rotation:
            fresh = new_session_token()
            body = RunnerSession(token=fresh).model_dump(mode="json")
            for bearer in (self._token, fresh):
                response = self._answer("POST", path, bearer, body, None, 30.0, True, abort)
                if response.status_code != 401:
                    break
            if response.is_success:
                self._token = fresh
                return
        self._judge("POST", path, response)

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float = 30.0,
        retry: bool = True,
        abort: threading.Event | None = None,
        download_to: Path | None = None,
        give_up_after: float | None = None,
        content: bytes | None = None,
    ) -> httpx.Response:
        """One protocol call. download_to streams a 200 body into that file instead of
        memory (the workdir archive may be large). give_up_after: raise Unreachable once
        that many seconds of retrying passed (None: retry until the server answers).
        content: a raw body (a chunk pack) instead of json."""
        response = self._with_current_token(
            lambda bearer: self._answer(
                method,
                path,
                bearer,
                json,
                params,
                timeout,
                retry,
                abort,
                download_to,
                give_up_after,
                content,
            )
        )
        return self._judge(method, path, response)

    @contextlib.contextmanager
    def stream(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> Iterator[httpx.Response]:
        """call() for a body read as it comes (response.iter_bytes()): getting the answer is
        retried and judged as call() does it; a break after that raises httpx.TransportError
        to the reader, who may ask again for what it lacks."""
        response = self._with_current_token(
            lambda bearer: self._answer(
                method, path, bearer, None, params, timeout, True, None, stream=True
            )
        )
        try:
            yield self._judge(method, path, response)
        finally:
            response.close()

    def _with_current_token(self, ask: Callable[[str], httpx.Response]) -> httpx.Response:
        """ask(bearer)'s answer under the session's token, asked again when open_session
        replaced the token while it was out (its 401 was for the old one)."""
        while True:
            bearer = self._token
            response = ask(bearer)
            if response.status_code == 401 and self._settled_token() != bearer:
                continue  # open_session replaced the token while this call was out
            return response

    def _settled_token(self) -> str:
        """The token once no open_session is under way."""
        with self._rotation:
            return self._token

    def _answer(
        self,
        method: str,
        path: str,
        bearer: str,
        json: Any,
        params: dict[str, Any] | None,
        timeout: float,
        retry: bool,
        abort: threading.Event | None,
        download_to: Path | None = None,
        give_up_after: float | None = None,
        content: bytes | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        """The server's first answer that is not worth retrying, unjudged (with stream, a
        200's body is left to be read)."""
        delay = self._backoff_start
        failures = 0
        deadline = None if give_up_after is None else time.monotonic() + give_up_after
        headers = {"Authorization": f"Bearer {bearer}"}
        while True:
            if self.gone.is_set():
                raise ServerGone(f"{method} {path}: the server no longer knows this instance")
            try:
                response = self._attempt(
                    method, path, headers, json, params, timeout, download_to, content, stream
                )
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code not in _RETRY_STATUS:
                    if failures:
                        log.info("server answers again after %d failed attempts", failures)
                    return response
                problem = f"HTTP {response.status_code}"
            if not retry or (deadline is not None and time.monotonic() >= deadline):
                raise Unreachable(f"{method} {path}: {problem}")
            failures += 1
            level = logging.WARNING if failures == 1 else logging.DEBUG
            log.log(level, "%s %s failed (%s); retrying in %.1f s", method, path, problem, delay)
            self._sleep(delay, abort)
            delay = min(delay * 2, self._backoff_max)

    def _attempt(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        json: Any,
        params: dict[str, Any] | None,
        timeout: float,
        download_to: Path | None,
        content: bytes | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        if stream:
            request = self._client.build_request(
                method, path, headers=headers, params=params, timeout=timeout
            )
            response = self._client.send(request, stream=True)
            if response.status_code != 200:
                response.read()  # an error's short body, for the caller and the log
            return response
        if download_to is None:
            sent = dict(headers)
            body = None if content is None else as_pieces(content, sent)  # may add a header
            request = self._client.build_request(
                method,
                path,
                headers=sent,
                json=json,
                params=params,
                timeout=timeout,
                content=body,
            )
            response = self._client.send(request, stream=True)
            try:
                return _read_whole(response)
            finally:
                response.close()
        with self._client.stream(
            method, path, headers=headers, params=params, timeout=timeout
        ) as response:
            if response.status_code == 200:
                with download_to.open("wb") as out:
                    for block in response.iter_bytes(1024 * 1024):
                        out.write(block)
            else:
                response.read()
            return response

    def _judge(self, method: str, path: str, response: httpx.Response) -> httpx.Response:
        code = response.status_code
        if code == 401:
            self.gone.set()
            self._on_stop("the server does not know this instance any more (401): released")
            raise ServerGone(f"{method} {path}: 401")
        if code == 409:
            self._on_stop(f"{method} {path} no longer applies (409): stopping")
        elif 400 <= code < 500:
            log.error("%s %s refused with %d: %s", method, path, code, response.text[:500])
        return response

    def _sleep(self, seconds: float, abort: threading.Event | None) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if abort is not None and abort.is_set():
                raise Aborted()
            if self.gone.wait(min(left, 0.1)):
                return  # the loop raises ServerGone
        if abort is not None and abort.is_set():
            raise Aborted()


# Bodies larger than this (a chunk pack of a dataset) are read into one buffer of their
# length as they arrive: keeping httpx's pieces and joining them cost the runner about twice
# the CPU of 200 MB of packs.
_BUFFERED_BODY = 1024 * 1024


def _read_whole(response: httpx.Response) -> httpx.Response:
    """The response with its whole body read. A large body is that buffer itself, a
    bytearray as its `content` (bytes-like: json(), text and slicing work on it), not a
    bytes copy of it: the copy, a fresh allocation of 10 MB for each pack, was as much of the
    runner's time as reading the pack."""
    declared = response.headers.get("content-length", "")
    if (
        response.is_stream_consumed  # an in-process transport hands the body over whole
        or not declared.isdigit()
        or int(declared) <= _BUFFERED_BODY
        or response.headers.get("content-encoding", "identity") != "identity"
    ):
        response.read()
        return response
    body = bytearray(int(declared))
    at = 0
    for piece in response.iter_raw():
        if at + len(piece) > len(body):
            raise httpx.RemoteProtocolError("the body is longer than its Content-Length")
        body[at : at + len(piece)] = piece
        at += len(piece)
    if at != len(body):
        raise httpx.RemoteProtocolError(f"the body ended after {at} of {len(body)} bytes")
    whole = httpx.Response(
        response.status_code,
        headers=response.headers,
        request=response.request,
        extensions=response.extensions,
    )
    whole._content = body  # type: ignore[assignment]  # what read() sets, without its copy
    return whole
