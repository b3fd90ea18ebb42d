"""The runner's HTTP conversation with the server: bearer token, retries with backoff."""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gpulease.client.trust import pinned_context

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


class Connection:
    """Calls under spec.server_url with the instance's token.

    With retry (the default) a call is repeated on network errors and 5xx, waiting 0.2 s
    doubling to 5 s, until it gets an answer: every runner call is idempotent. A 401 sets
    `gone`, calls on_stop and raises ServerGone (also in every later call); a 409 calls
    on_stop and is returned to the caller. Other 4xx are logged and returned.
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
    ) -> None:
        # An https server with a self-signed certificate: trust exactly that one (the spec
        # carries it); otherwise verify as usual.
        verify: ssl.SSLContext | bool = (
            pinned_context(server_certificate) if server_certificate else True
        )
        self._client = httpx.Client(
            base_url=server_url,
            headers={"Authorization": f"Bearer {token}"},
            transport=transport,
            timeout=30.0,
            verify=verify,
        )
        self._on_stop = on_stop
        self._backoff_start = backoff_start_s
        self._backoff_max = backoff_max_s
        self.gone = threading.Event()

    def close(self) -> None:
        self._client.close()

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
    ) -> httpx.Response:
        """One protocol call. download_to streams a 200 body into that file instead of
        memory (the workdir archive may be large). give_up_after: raise Unreachable once
        that many seconds of retrying passed (None: retry until the server answers)."""
        delay = self._backoff_start
        failures = 0
        deadline = None if give_up_after is None else time.monotonic() + give_up_after
        while True:
            if self.gone.is_set():
                raise ServerGone(f"{method} {path}: the server no longer knows this instance")
            try:
                response = self._attempt(method, path, json, params, timeout, download_to)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code not in _RETRY_STATUS:
                    if failures:
                        log.info("server answers again after %d failed attempts", failures)
                    return self._judge(method, path, response)
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
        json: Any,
        params: dict[str, Any] | None,
        timeout: float,
        download_to: Path | None,
    ) -> httpx.Response:
        if download_to is None:
            return self._client.request(method, path, json=json, params=params, timeout=timeout)
        with self._client.stream(method, path, params=params, timeout=timeout) as response:
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
