"""Guessing resistance: sliding-window limits on failed logins (per account and per client
address), registrations (per address) and wrong bearer tokens (per address and per token
they began like), and the failed logins an admin can read.

The counts are rows of `auth_attempts`, so every process and replica of the server shares
them and a restart forgets nothing. Only attempts are written, never refusals (a refused
login leaves at most one row per address a minute, for the admin): a guesser past a limit
costs the database reads, not writes. Each write prunes the rows that left the window,
keeping the latest failed logins for the admin.

An address is counted by its network where one holder has many: an IPv6 address by its /64
(one host's share, in the usual assignment), an IPv4-mapped one as the IPv4 address. The
clock is injected so that tests move time instead of waiting.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import HTTPException
from sqlalchemy import ColumnElement, delete, exists, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker

from gpulease.core.errors import GpuleaseError
from gpulease.server.db import readers, transaction
from gpulease.server.orm import ApiToken, AuthAttempt
from gpulease.server.security import TOKEN_PREFIX
from gpulease.server.settings import Settings

log = logging.getLogger(__name__)

Clock = Callable[[], float]  # seconds, like time.time()
FAILED_LOGINS_KEPT = 1000  # of each kind, failed and refused, past the window
REFUSALS_NOTED_EVERY = timedelta(minutes=1)  # per address, in the admin's list
TOKEN_NAME_LENGTH = 10  # an API token's stored prefix: "glp_" and 6 random characters
# How long a process trusts a read that found no wrong token from an address (and like a
# token) in the window, before it reads again: what another replica counts meanwhile is seen
# at most this late; what this process counts, at once.
CLEAR_FOR_S = 1.0
CLEAR_KEPT = 10_000  # (address, token) pairs remembered as clear; forgotten all at once past it

LOGIN = "login"
LOGIN_REFUSED = "login-refused"
REGISTER = "register"
TOKEN = "token"
REFUSED_REASON = "rate limited"


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


@dataclass(frozen=True)
class SlidingWindow:
    """At most `limit` attempts of `kind` per key (the value of `column`) within the last
    `window` before now."""

    kind: str
    column: InstrumentedAttribute[str]
    limit: int
    window: timedelta

    def retry_after(self, session: Session, key: str, now: datetime) -> float | None:
        """Seconds until `key` may try again, or None when it may now."""
        times = session.scalars(
            select(AuthAttempt.at)
            .where(
                AuthAttempt.kind == self.kind,
                self.column == key,
                AuthAttempt.at > now - self.window,
            )
            .order_by(AuthAttempt.at.desc())
            .limit(self.limit)
        ).all()
        if len(times) < self.limit:
            return None
        return (times[-1] + self.window - now).total_seconds()


@dataclass(frozen=True)
class FailedLogin:
    at: datetime
    name: str
    address: str
    reason: str  # "wrong name or password" | … | "rate limited"


class AuthGuard:
    """The limits of the server, counted in its database. Each check and count is a short
    transaction of its own: call them outside any transaction of the request, which on
    SQLite (one writer at a time) they would wait for forever."""

    def __init__(
        self, settings: Settings, sessions: sessionmaker[Session], clock: Clock = time.time
    ) -> None:
        window = timedelta(seconds=settings.auth_window_s)
        self.window = window
        self.sessions = sessions
        self.readers = readers(sessions)
        self.clock = clock
        # (address key, token name) -> clock time until which it is known to hold no wrong
        # token: a runner's heartbeats, logs and metrics skip the read (half of the server's
        # CPU for a small request went to it). wrong_tokens counts this process's wrong
        # tokens, so that a read that raced one is not remembered as clear.
        self._clear: dict[tuple[str, str], float] = {}
        self._wrong_tokens = 0
        subject, address = AuthAttempt.subject, AuthAttempt.address_key
        self.by_account = SlidingWindow(LOGIN, subject, settings.login_failures_per_account, window)
        self.by_address = SlidingWindow(LOGIN, address, settings.login_failures_per_address, window)
        self.registrations = SlidingWindow(
            REGISTER, address, settings.registrations_per_address, window
        )
        self.bad_tokens = SlidingWindow(TOKEN, address, settings.token_failures_per_address, window)
        self.bad_tokens_of = SlidingWindow(
            TOKEN, subject, settings.token_failures_per_token, window
        )

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    def _refusal(self, what: str, wait: float | None, now: datetime) -> TooManyAttempts | None:
        if wait is None:
            return None
        return TooManyAttempts(what, wait, now + timedelta(seconds=math.ceil(wait)))

    def _record(self, session: Session, kind: str, subject: str, address: str, reason: str) -> None:
        now = self.now()
        session.add(
            AuthAttempt(
                kind=kind,
                subject=subject[:64],
                address_key=address_key(address)[:64],
                address=address[:64],
                reason=reason[:100],
                at=now,
            )
        )
        self.prune(session, now)

    def prune(self, session: Session, now: datetime) -> None:
        """Delete the attempts that left the window, but the latest FAILED_LOGINS_KEPT of the
        failed and of the refused logins."""
        cutoff = now - self.window
        session.execute(
            delete(AuthAttempt).where(
                AuthAttempt.at <= cutoff, AuthAttempt.kind.not_in((LOGIN, LOGIN_REFUSED))
            )
        )
        for kind in (LOGIN, LOGIN_REFUSED):
            oldest_kept = (
                select(AuthAttempt.at)
                .where(AuthAttempt.kind == kind)
                .order_by(AuthAttempt.at.desc())
                .offset(FAILED_LOGINS_KEPT - 1)
                .limit(1)
                .scalar_subquery()
            )
            session.execute(
                delete(AuthAttempt).where(
                    AuthAttempt.kind == kind, AuthAttempt.at <= cutoff, AuthAttempt.at < oldest_kept
                )
            )

    def check_login(self, name: str, address: str) -> None:
        """TooManyAttempts when this account or this address failed too often lately; even
        the right password waits then (that is what stops a guesser)."""
        now, account = self.now(), _account(name)
        with transaction(self.sessions) as session:
            account_wait = self.by_account.retry_after(session, account, now)
            address_wait = self.by_address.retry_after(session, address_key(address), now)
            refusal = self._refusal(
                f"failed logins for {name[:64]!r}", account_wait, now
            ) or self._refusal("failed logins from your address", address_wait, now)
            if refusal is not None and not self._refusal_noted(session, address, now):
                self._record(session, LOGIN_REFUSED, account, address, REFUSED_REASON)
        if refusal is not None:
            raise refusal

    def _refusal_noted(self, session: Session, address: str, now: datetime) -> bool:
        return (
            session.scalar(
                select(AuthAttempt.id)
                .where(
                    AuthAttempt.kind == LOGIN_REFUSED,
                    AuthAttempt.address_key == address_key(address),
                    AuthAttempt.at > now - REFUSALS_NOTED_EVERY,
                )
                .limit(1)
            )
            is not None
        )

    def login_failed(self, name: str, address: str, reason: str) -> None:
        with transaction(self.sessions) as session:
            self._record(session, LOGIN, _account(name), address, reason)
        log.warning("failed login for %r from %s: %s", name[:64], address, reason)

    def check_registration(self, address: str) -> None:
        now = self.now()
        with transaction(self.sessions) as session:
            wait = self.registrations.retry_after(session, address_key(address), now)
        refusal = self._refusal("accounts registered from your address", wait, now)
        if refusal is not None:
            raise refusal

    def registered(self, address: str) -> None:
        with transaction(self.sessions) as session:
            self._record(session, REGISTER, "", address, "registered")

    def known_clear(self, address: str, secret: str) -> bool:
        """Whether a read of the last CLEAR_FOR_S found no wrong token from this address or
        like this one (check_token would pass it): no database, so it may run on the event
        loop, where a request then skips the thread check_token would take."""
        until = self._clear.get((address_key(address), token_name(secret)))
        return until is not None and until > self.clock()

    def check_token(self, address: str, secret: str) -> None:
        """TooManyAttempts when this address, or callers of any address presenting tokens
        that begin like this one, sent too many wrong ones lately; the right token waits
        too then."""
        if self.known_clear(address, secret):
            return
        seconds = self.clock()
        now, name, key = (
            datetime.fromtimestamp(seconds, UTC),
            token_name(secret),
            address_key(address),
        )
        wrong_tokens = self._wrong_tokens
        # Every bearer request passes here: one read, without a write lock, answers the
        # usual case (no wrong token from this address or like this one in the window).
        with transaction(self.readers) as session:
            if not self._tokens_failed(session, key, name, now):
                if wrong_tokens == self._wrong_tokens:
                    if len(self._clear) >= CLEAR_KEPT:
                        self._clear.clear()
                    self._clear[(key, name)] = seconds + CLEAR_FOR_S
                return
            address_wait = self.bad_tokens.retry_after(session, key, now)
            token_wait = self.bad_tokens_of.retry_after(session, name, now) if name else None
        refusal = self._refusal(
            "requests with an invalid token from your address", address_wait, now
        ) or self._refusal(
            "requests with an invalid token that begins like this one", token_wait, now
        )
        if refusal is not None:
            raise refusal

    def _tokens_failed(self, session: Session, key: str, name: str, now: datetime) -> bool:
        """Whether any wrong token from the address `key`, or beginning like `name`, is in the
        window: without one neither of the token limits can be reached."""
        since = now - self.window
        recent = AuthAttempt.kind == TOKEN, AuthAttempt.at > since
        seen: ColumnElement[bool] = exists().where(*recent, AuthAttempt.address_key == key)
        if name:
            seen = or_(seen, exists().where(*recent, AuthAttempt.subject == name))
        return bool(session.scalar(select(seen)))

    def token_failed(self, address: str, secret: str) -> None:
        """Count a refused bearer token against its address and, when it begins like a
        token of the database, against that token."""
        name = token_name(secret)
        with transaction(self.sessions) as session:
            if name and session.scalar(select(ApiToken.id).where(ApiToken.prefix == name)) is None:
                name = ""
            self._record(session, TOKEN, name, address, "invalid token")
        self._wrong_tokens += 1
        self._clear.clear()

    def failed_logins(self, session: Session, limit: int = 100) -> list[FailedLogin]:
        """The latest failed (and refused) logins, newest first."""
        rows = session.scalars(
            select(AuthAttempt)
            .where(AuthAttempt.kind.in_((LOGIN, LOGIN_REFUSED)))
            .order_by(AuthAttempt.at.desc(), AuthAttempt.id.desc())
            .limit(limit)
        ).all()
        return [FailedLogin(r.at, r.subject, r.address, r.reason) for r in rows]


def _account(name: str) -> str:
    return name.strip().lower()[:64]


def token_name(secret: str) -> str:
    """The part of an API token's secret that names its row (ApiToken.prefix), or "" for a
    secret that is not shaped like one."""
    if secret.startswith(TOKEN_PREFIX) and len(secret) > TOKEN_NAME_LENGTH:
        return secret[:TOKEN_NAME_LENGTH]
    return ""


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


def guard_of(state: Any, settings: Settings, sessions: sessionmaker[Session]) -> AuthGuard:
    """The app's guard (app.state.auth_guard), made at first use; tests put their own there
    to inject a clock."""
    guard = getattr(state, "auth_guard", None)
    if not isinstance(guard, AuthGuard):
        guard = AuthGuard(settings, sessions)
        state.auth_guard = guard
    return guard
