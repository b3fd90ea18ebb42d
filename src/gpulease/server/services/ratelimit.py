"""Guessing resistance: sliding-window limits on failed logins (per account and per client
address), registrations and bad bearer tokens (per address), and the failed logins an admin
can read.

An address is counted by its network where one holder has many: an IPv6 address by its /64
(one host's share, in the usual assignment), an IPv4-mapped one as the IPv4 address. Counts
live in this process (one AuthGuard per app), on purpose (docs/sandbox.md, "Guessing
limits"): each replica of a multi-replica server counts on its own, and a restart forgets
the current window. Failed logins also go to the server's log, which outlives both. The
clock is injected so that tests move time instead of waiting.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import HTTPException

from gpulease.core.errors import GpuleaseError
from gpulease.server.settings import Settings

log = logging.getLogger(__name__)

Clock = Callable[[], float]  # seconds, like time.time()
FAILED_LOGINS_KEPT = 1000
MAX_KEYS = 100_000  # distinct accounts/addresses tracked per window before the oldest go


class TooManyAttempts(GpuleaseError):
    """429: a message that says when to try again, and Retry-After in whole seconds."""

    status = 429

    def __init__(self, what: str, retry_after_s: float, when: datetime) -> None:
        seconds = max(1, math.ceil(retry_after_s))
        super().__init__(
            f"too many {what}; try again in {_span(seconds)} (after {when:%H:%M:%S} UTC)"
        )
        self.retry_after_s = seconds

    def http(self) -> HTTPException:
        """The same refusal as an HTTPException, which carries the Retry-After header."""
        return HTTPException(429, self.message, headers={"Retry-After": str(self.retry_after_s)})


def _span(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} s"
    return f"{math.ceil(seconds / 60)} min"


class SlidingWindow:
    """At most `limit` events per key within the last `window_s` seconds."""

    def __init__(self, limit: int, window_s: float, clock: Clock) -> None:
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._events: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _pruned(self, key: str, now: float) -> deque[float] | None:
        events = self._events.get(key)
        if events is None:
            return None
        while events and events[0] <= now - self.window_s:
            events.popleft()
        if not events:
            del self._events[key]
            return None
        return events

    def retry_after(self, key: str) -> float | None:
        """Seconds until `key` may try again, or None when it may now."""
        with self._lock:
            now = self._clock()
            events = self._pruned(key, now)
            if events is None or len(events) < self.limit:
                return None
            return events[-self.limit] + self.window_s - now

    def hit(self, key: str) -> None:
        with self._lock:
            now = self._clock()
            events = self._pruned(key, now)
            if events is None:
                if len(self._events) >= MAX_KEYS:  # forget the key seen longest ago
                    del self._events[next(iter(self._events))]
                events = self._events[key] = deque()
            events.append(now)
            while len(events) > self.limit:
                events.popleft()


@dataclass(frozen=True)
class FailedLogin:
    at: datetime
    name: str
    address: str
    reason: str  # "wrong password" | "unknown user" | "rate limited"


class AuthGuard:
    """The limits of one server process."""

    def __init__(self, settings: Settings, clock: Clock = time.time) -> None:
        window = settings.auth_window_s
        self.clock = clock
        self.by_account = SlidingWindow(settings.login_failures_per_account, window, clock)
        self.by_address = SlidingWindow(settings.login_failures_per_address, window, clock)
        self.registrations = SlidingWindow(settings.registrations_per_address, window, clock)
        self.bad_tokens = SlidingWindow(settings.token_failures_per_address, window, clock)
        self._failed: deque[FailedLogin] = deque(maxlen=FAILED_LOGINS_KEPT)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    def _refuse(self, what: str, wait: float | None) -> None:
        if wait is not None:
            raise TooManyAttempts(what, wait, self.now() + timedelta(seconds=math.ceil(wait)))

    def check_login(self, name: str, address: str) -> None:
        """TooManyAttempts when this account or this address failed too often lately; even
        the right password waits then (that is what stops a guesser)."""
        account_wait = self.by_account.retry_after(_account(name))
        address_wait = self.by_address.retry_after(address_key(address))
        if account_wait is not None or address_wait is not None:
            self._failed.append(FailedLogin(self.now(), name[:64], address, "rate limited"))
        self._refuse(f"failed logins for {name[:64]!r}", account_wait)
        self._refuse("failed logins from your address", address_wait)

    def login_failed(self, name: str, address: str, reason: str) -> None:
        self.by_account.hit(_account(name))
        self.by_address.hit(address_key(address))
        self._failed.append(FailedLogin(self.now(), name[:64], address, reason))
        log.warning("failed login for %r from %s: %s", name[:64], address, reason)

    def _refuse_address(self, what: str, window: SlidingWindow, address: str) -> None:
        self._refuse(f"{what} from your address", window.retry_after(address_key(address)))

    def check_registration(self, address: str) -> None:
        self._refuse_address("accounts registered", self.registrations, address)

    def registered(self, address: str) -> None:
        self.registrations.hit(address_key(address))

    def check_token(self, address: str) -> None:
        self._refuse_address("requests with an invalid token", self.bad_tokens, address)

    def token_failed(self, address: str) -> None:
        self.bad_tokens.hit(address_key(address))

    def failed_logins(self, limit: int = 100) -> list[FailedLogin]:
        """The latest failed (and refused) logins, newest first."""
        return list(reversed(self._failed))[:limit]


def _account(name: str) -> str:
    return name.strip().lower()[:64]


def address_key(address: str) -> str:
    """What the per-address limits count an address as: an IPv6 address's /64 (a single
    host usually holds all of one), an IPv4-mapped IPv6 address as its IPv4 address, any
    other text (a Unix socket's peer, "unknown") as it is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def guard_of(state: Any, settings: Settings) -> AuthGuard:
    """The app's guard (app.state.auth_guard), made at first use; tests put their own there
    to inject a clock."""
    guard = getattr(state, "auth_guard", None)
    if not isinstance(guard, AuthGuard):
        guard = AuthGuard(settings)
        state.auth_guard = guard
    return guard
