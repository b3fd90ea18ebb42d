"""GpuleaseClient: typed methods over the server's REST API and its log event stream."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import date
from decimal import Decimal
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from gpulease.client.config import (
    TrustedCertificate,
    normalize_server_url,
    resolve_login,
    trusted_certificate,
)
from gpulease.client.datasets import PushProgress, PushResult, push_directory
from gpulease.client.errors import ApiError, ClientError, NotLoggedIn, ServerUnreachable
from gpulease.client.logstream import (
    EndEvent,
    LogEvent,
    LogStreamEvent,
    StatusEvent,
    StreamProtocolError,
    decode_event,
    parse_sse,
)
from gpulease.client.runstream import (
    START,
    RunStreamEvent,
    decode_run_event,
    parse_sse_events,
)
from gpulease.client.trust import (
    CertificateChanged,
    UntrustedCertificate,
    certificate_problem,
    changed_message,
    pinned_context,
    untrusted_message,
)
from gpulease.client.workdir import WorkdirArchive, pack_workdir
from gpulease.schemas.accounts import AuthResult, TokenCreated, TokenPublic, UserPublic
from gpulease.schemas.autostop import AutostopPublic, SchedulePublic
from gpulease.schemas.billing import (
    LimitsPublic,
    OffPeakPublic,
    PlanQuote,
    TeamPublic,
    VoucherPublic,
)
from gpulease.schemas.catalog import (
    GpuModelPublic,
    NodePublic,
    TemplateAvailabilityPublic,
    TemplatePublic,
)
from gpulease.schemas.datasets import (
    DatasetChunksReceived,
    DatasetDetail,
    DatasetFileEntry,
    DatasetList,
    DatasetMissingChunks,
    DatasetPublic,
    DatasetRemoved,
    DatasetUploadPublic,
)
from gpulease.schemas.estimates import EstimatePublic
from gpulease.schemas.instances import InstancePublic
from gpulease.schemas.ledger import Balance, LedgerLine, Usage
from gpulease.schemas.metrics import InstanceGpus, RunMetrics, RunsCompared
from gpulease.schemas.notifications import (
    NotificationChannelsPublic,
    NotificationChannelsUpdate,
    NotificationPublic,
)
from gpulease.schemas.runs import LogPage, RunPublic
from gpulease.schemas.statements import RevenuePublic, StatementPublic
from gpulease.schemas.support import SupportTicketDetail, SupportTicketPublic

API_PREFIX = "/api/v1"
# A proxy in front of a restarting server answers these; the log stream waits them out.
RETRYABLE_STATUSES = frozenset({502, 503, 504})
# The server sends a keep-alive comment on an idle stream every ~15 s.
STREAM_READ_TIMEOUT_S = 60.0

M = TypeVar("M", bound=BaseModel)
E = TypeVar("E")
InstanceRef = int | str
"""An instance's id or its name."""
ReconnectHook = Callable[[str, float], None]
"""Called before each reconnect of a broken log stream with (why, seconds until the retry)."""


def _path_part(ref: InstanceRef) -> str:
    return quote(str(ref), safe="")


def error_from_response(response: httpx.Response) -> ApiError:
    """The ApiError for a 4xx/5xx answer: the server's `detail` text when it sent one."""
    detail: str | None = None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "detail" in body:
        raw = body["detail"]
        detail = raw if isinstance(raw, str) else json.dumps(raw)
    if not detail:
        status = f"{response.status_code} {response.reason_phrase}".strip()
        if response.status_code >= 500:
            detail = f"the server failed ({status}); the server's log has the cause"
        else:
            detail = f"the server refused the request ({status})"
    return ApiError(response.status_code, detail)


class _Retryable(Exception):
    """A log stream answer worth waiting out (a proxy's 502 while the server restarts)."""


class GpuleaseClient:
    """One gpulease server, as one user (or anonymously, for register and login).

    `http` lets tests hand in a Starlette TestClient (an httpx.Client) to run against the
    ASGI app in process; the caller keeps owning it. Otherwise the client makes its own
    httpx.Client (with `transport`, if given) and closes it in close().

    Every refusal raises ApiError(status, the server's message); no answer at all raises
    ServerUnreachable naming the URL.

    `trusted`: the certificate pinned for an https server with a self-signed certificate
    (see client/trust.py); the client then trusts exactly it, and raises CertificateChanged
    when the server shows another. Without it, certificates are verified as usual.
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

    @classmethod
    def from_saved_login(cls, **kwargs: Any) -> GpuleaseClient:
        """A client for the saved login (GPULEASE_SERVER / GPULEASE_TOKEN override it)."""
        login = resolve_login()
        if login.server is None:
            raise NotLoggedIn("not logged in: run `gpulease login --server URL` first")
        kwargs.setdefault("trusted", trusted_certificate(login.server))
        return cls(login.server, login.token, **kwargs)

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> GpuleaseClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.server_url}{API_PREFIX}{path}"

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if extra:
            headers.update(extra)
        return headers

    def _transport_error(self, exc: httpx.TransportError) -> ClientError:
        """A refused certificate, said plainly; otherwise ServerUnreachable."""
        if certificate_problem(exc) is None:
            return self._unreachable(exc)
        if self.trusted is not None:
            return CertificateChanged(changed_message(self.server_url, self.trusted.fingerprint))
        return UntrustedCertificate(untrusted_message(self.server_url))

    def _unreachable(self, exc: httpx.TransportError) -> ServerUnreachable:
        if isinstance(exc, httpx.TimeoutException):
            return ServerUnreachable(self.server_url, f"no answer within {self.timeout:g} s")
        return ServerUnreachable(self.server_url, str(exc) or type(exc).__name__)

    def _send(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        params: Mapping[str, str | int] | None = None,
        content: Iterator[bytes] | bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        try:
            response = self._http.request(
                method,
                self._url(path),
                json=body,
                params=params,
                content=content,
                headers=self._headers(headers),
            )
        except httpx.TransportError as exc:
            raise self._transport_error(exc) from exc
        if response.is_error:
            raise error_from_response(response)
        return response

    def _unexpected(self, path: str, exc: Exception) -> ClientError:
        return ClientError(
            f"unexpected answer from {self.server_url} to {path} ({exc}); "
            "is it a gpulease server of a matching version?"
        )

    def _one(self, model: type[M], method: str, path: str, **kwargs: Any) -> M:
        response = self._send(method, path, **kwargs)
        try:
            return model.model_validate(response.json())
        except (ValidationError, ValueError) as exc:
            raise self._unexpected(path, exc) from exc

    def _many(self, model: type[M], path: str, **kwargs: Any) -> list[M]:
        response = self._send("GET", path, **kwargs)
        try:
            data = response.json()
            if not isinstance(data, list):
                raise ValueError("expected a list")
            return [model.model_validate(item) for item in data]
        except (ValidationError, ValueError) as exc:
            raise self._unexpected(path, exc) from exc

    # -- accounts ---------------------------------------------------------------------------

    def register(self, name: str, password: str, *, email: str | None = None) -> AuthResult:
        """Create an account; the answer carries a token for it (the client starts using it)."""
        body = {"name": name, "password": password, "email": email}
        result = self._one(AuthResult, "POST", "/auth/register", body=body)
        self.token = result.token
        return result

    def login(self, name: str, password: str, *, token_name: str = "cli login") -> AuthResult:
        """Trade a password for a new token (the client starts using it)."""
        body = {"name": name, "password": password, "token_name": token_name}
        result = self._one(AuthResult, "POST", "/auth/login", body=body)
        self.token = result.token
        return result

    def me(self) -> UserPublic:
        return self._one(UserPublic, "GET", "/me")

    def list_tokens(self) -> list[TokenPublic]:
        return self._many(TokenPublic, "/tokens")

    def create_token(self, name: str) -> TokenCreated:
        """A new API token; its secret (`.token`) is shown this once only."""
        return self._one(TokenCreated, "POST", "/tokens", body={"name": name})

    def revoke_token(self, token_id: int) -> None:
        self._send("DELETE", f"/tokens/{int(token_id)}")

    # -- catalog ----------------------------------------------------------------------------

    def gpus(self) -> list[GpuModelPublic]:
        """The GPU catalog with prices and live free/total counts."""
        return self._many(GpuModelPublic, "/gpus")

    def templates(self) -> list[TemplatePublic]:
        """Built-in templates and your own (mine/NAME), each with where it can run."""
        return self._many(TemplatePublic, "/templates")

    def template_availability(self, name: str) -> list[TemplateAvailabilityPublic]:
        """Per GPU model: whether instances of it can run template `name`, and why not."""
        quoted = "/".join(quote(part, safe="") for part in name.split("/"))
        return self._many(TemplateAvailabilityPublic, f"/templates/{quoted}/availability")

    def delete_template(self, name: str) -> None:
        """Delete your template mine/NAME (NAME alone works too)."""
        short = name.removeprefix("mine/")
        self._send("DELETE", f"/templates/mine/{quote(short, safe='')}")

    def save_template(self, ref: InstanceRef, name: str) -> TemplatePublic:
        """Save a running instance's environment as your template mine/NAME (pending until
        its runner has answered; see templates())."""
        return self._one(
            TemplatePublic,
            "POST",
            f"/instances/{_path_part(ref)}/save-template",
            body={"name": name},
        )

    def nodes(self) -> list[NodePublic]:
        """Hosts and their GPUs (admins only)."""
        return self._many(NodePublic, "/nodes")

    # -- instances --------------------------------------------------------------------------

    def create_instance(
        self,
        gpu: str | None = None,
        template: str = "pytorch",
        *,
        name: str | None = None,
        auto_release: bool = False,
        awaiting_workdir: bool = False,
        datasets: Sequence[str] = (),
        plan: str = "on_demand",
        team: str | None = None,
        start_when_cheap: bool = False,
        auto_renew: bool = False,
        idle_minutes: int | None = None,
        max_runtime_minutes: int | None = None,
    ) -> InstancePublic:
        """Rent `gpu` ("A100-80GB:4"; None for CPU only). It starts queued; poll its status.
        awaiting_workdir: an upload_workdir() follows; the server holds the instance in the
        queue until it has the files. datasets: yours, mounted read-only at /data/NAME.
        plan: on_demand, daily or spot (see plans()); team: charge that team's wallet;
        start_when_cheap: wait for an off-peak window; auto_renew: daily blocks renew.
        idle_minutes, max_runtime_minutes: automatic stop (see set_autostop)."""
        body: dict[str, object] = {
            "gpu": gpu,
            "template": template,
            "name": name,
            "auto_release": auto_release,
            "awaiting_workdir": awaiting_workdir,
            "datasets": list(datasets),
            "plan": plan,
            "team": team,
            "start_when_cheap": start_when_cheap,
            "auto_renew": auto_renew,
        }
        if idle_minutes is not None or max_runtime_minutes is not None:
            body["idle_minutes"] = idle_minutes
            body["max_runtime_minutes"] = max_runtime_minutes
        return self._one(InstancePublic, "POST", "/instances", body=body)

    def list_instances(self, *, include_released: bool = False) -> list[InstancePublic]:
        params = {"all": "true"} if include_released else None
        return self._many(InstancePublic, "/instances", params=params)

    def get_instance(self, ref: InstanceRef) -> InstancePublic:
        return self._one(InstancePublic, "GET", f"/instances/{_path_part(ref)}")

    def stop_instance(self, ref: InstanceRef) -> InstancePublic:
        """Ask for a stop: billing ends once the runner has stopped; the workspace stays."""
        return self._one(InstancePublic, "POST", f"/instances/{_path_part(ref)}/stop")

    def start_instance(self, ref: InstanceRef, *, no_gpu: bool = False) -> InstancePublic:
        """Queue a stopped instance again; no_gpu: CPU only at the CPU price, for setup and
        data work (a later plain start brings its GPUs back)."""
        path = f"/instances/{_path_part(ref)}/start"
        if no_gpu:
            return self._one(InstancePublic, "POST", path, body={"no_gpu": True})
        return self._one(InstancePublic, "POST", path)

    # -- automatic stop and start, resize ---------------------------------------------

    def autostop(self, ref: InstanceRef) -> AutostopPublic:
        return self._one(AutostopPublic, "GET", f"/instances/{_path_part(ref)}/autostop")

    def set_autostop(
        self,
        ref: InstanceRef,
        *,
        idle_util_pct: float | None = None,
        idle_minutes: int | None = None,
        max_runtime_minutes: int | None = None,
        stop_after_run: int | None = None,
    ) -> AutostopPublic:
        """Replace the instance's automatic stop: idle below idle_util_pct % for
        idle_minutes, after max_runtime_minutes running, when run stop_after_run ends.
        None turns that part off."""
        body = {
            "idle_util_pct": idle_util_pct,
            "idle_minutes": idle_minutes,
            "max_runtime_minutes": max_runtime_minutes,
            "stop_after_run": stop_after_run,
        }
        return self._one(AutostopPublic, "PUT", f"/instances/{_path_part(ref)}/autostop", body=body)

    def add_schedule(
        self, ref: InstanceRef, action: str, cron: str, *, timezone: str | None = None
    ) -> SchedulePublic:
        """Start or stop the instance at the times a cron expression names ("0 9 * * 1-5"),
        in your time zone (set_timezone) unless `timezone` is given."""
        body = {"action": action, "cron": cron, "timezone": timezone}
        return self._one(
            SchedulePublic, "POST", f"/instances/{_path_part(ref)}/schedules", body=body
        )

    def schedules(self, ref: InstanceRef) -> list[SchedulePublic]:
        return self._many(SchedulePublic, f"/instances/{_path_part(ref)}/schedules")

    def remove_schedule(self, ref: InstanceRef, schedule_id: int) -> None:
        self._send("DELETE", f"/instances/{_path_part(ref)}/schedules/{int(schedule_id)}")

    def set_timezone(self, timezone: str) -> UserPublic:
        """Your time zone (an IANA name such as Europe/Berlin); schedules fire in it."""
        return self._one(UserPublic, "PUT", "/me/timezone", body={"timezone": timezone})

    def resize_instance(
        self,
        ref: InstanceRef,
        gpu_model: str | None = None,
        gpu_count: int | None = None,
        *,
        no_gpu: bool = False,
    ) -> InstancePublic:
        """Give a stopped instance another GPU model and/or count, or none (no_gpu); its
        workspace is kept and its price follows the catalog."""
        body = {"gpu_model": gpu_model, "gpu_count": gpu_count, "no_gpu": no_gpu}
        return self._one(InstancePublic, "POST", f"/instances/{_path_part(ref)}/resize", body=body)

    def release_instance(self, ref: InstanceRef) -> InstancePublic:
        """Give the instance up for good: it stops and its workspace is deleted."""
        return self._one(InstancePublic, "POST", f"/instances/{_path_part(ref)}/release")

    def upload_workdir(self, ref: InstanceRef, source: Path | WorkdirArchive) -> int:
        """Upload a directory (packed here, see pack_workdir) or an already packed archive
        as the instance's workdir; returns the bytes sent."""
        archive = source if isinstance(source, WorkdirArchive) else pack_workdir(source)
        try:
            self._send(
                "PUT",
                f"/instances/{_path_part(ref)}/workdir",
                content=archive.chunks(),
                headers={"Content-Type": "application/gzip", "Content-Length": str(archive.size)},
            )
        finally:
            if archive is not source:
                archive.close()
        return archive.size

    # -- runs -------------------------------------------------------------------------------

    def create_run(
        self,
        ref: InstanceRef,
        command: str,
        env: Mapping[str, str] | None = None,
        *,
        stop_instance_on_exit: bool = False,
    ) -> RunPublic:
        """Run `command` (a bash script) in the instance's workspace; it waits while the
        instance is queued or starting."""
        body = {
            "command": command,
            "env": dict(env or {}),
            "stop_instance_on_exit": stop_instance_on_exit,
        }
        return self._one(RunPublic, "POST", f"/instances/{_path_part(ref)}/runs", body=body)

    def list_runs(self, *, instance_id: int | None = None) -> list[RunPublic]:
        """The newest runs first (at most 100)."""
        params = {"instance_id": instance_id} if instance_id is not None else None
        return self._many(RunPublic, "/runs", params=params)

    def get_run(self, run_id: int) -> RunPublic:
        return self._one(RunPublic, "GET", f"/runs/{int(run_id)}")

    def read_logs(self, run_id: int, after: int = -1, limit: int = 1000) -> LogPage:
        """One page of output: chunks with seq > after; pass `next_after` for the next page."""
        params = {"after": after, "limit": limit}
        return self._one(LogPage, "GET", f"/runs/{int(run_id)}/logs", params=params)

    def follow_logs(
        self,
        run_id: int,
        after: int = -1,
        *,
        give_up_after: float | None = 600.0,
        retry_delay: float = 0.2,
        max_retry_delay: float = 5.0,
        on_reconnect: ReconnectHook | None = None,
    ) -> Iterator[LogStreamEvent]:
        """Live events of a run until its EndEvent: LogEvent per output chunk (seq > after),
        StatusEvent per status change, then EndEvent.

        A dropped connection (a server restart, a proxy timeout) is retried with backoff
        from the last seq seen, so no chunk is lost or repeated; ServerUnreachable only
        after `give_up_after` seconds without getting anything through (None: never).
        """
        last_seq = after
        last_status: str | None = None

        def fresh(lines: Iterator[str]) -> Iterator[LogStreamEvent | None]:
            nonlocal last_seq, last_status
            for message in parse_sse(lines):
                event = decode_event(message)
                if isinstance(event, LogEvent):
                    if event.chunk.seq <= last_seq:
                        event = None  # already delivered before a reconnect
                    else:
                        last_seq = event.chunk.seq
                elif isinstance(event, StatusEvent):
                    if event.run.status == last_status:
                        event = None
                    else:
                        last_status = event.run.status
                yield event

        stream: Iterator[LogStreamEvent] = self._resumable_stream(
            f"/runs/{int(run_id)}/logs/stream",
            f"the log stream of run {run_id}",
            lambda: {"after": last_seq},
            fresh,
            give_up_after=give_up_after,
            retry_delay=retry_delay,
            max_retry_delay=max_retry_delay,
            on_reconnect=on_reconnect,
        )
        yield from stream

    # -- metrics -------------------------------------------------------------------------

    def run_metrics(
        self, run_id: int, keys: Sequence[str] | None = None, *, max_points: int = 2000
    ) -> RunMetrics:
        """The run's curves, each downsampled to at most max_points (extremes kept; the raw
        points stay on the server: run_metrics_csv). keys None: every key."""
        params: dict[str, str | int] = {"max_points": max_points}
        if keys:
            params["keys"] = ",".join(keys)
        return self._one(RunMetrics, "GET", f"/runs/{int(run_id)}/metrics", params=params)

    def run_metrics_csv(self, run_id: int) -> str:
        """Every raw point of the run: key,step,value,time,source."""
        return self._send("GET", f"/runs/{int(run_id)}/metrics.csv").text

    def compare_runs(
        self, run_ids: Sequence[int], key: str = "loss", *, max_points: int = 1000
    ) -> RunsCompared:
        """One key's curve of each run, to overlay."""
        params: dict[str, str | int] = {
            "ids": ",".join(str(int(i)) for i in run_ids),
            "key": key,
            "max_points": max_points,
        }
        return self._one(RunsCompared, "GET", "/runs/compare", params=params)

    def instance_gpus(
        self, ref: InstanceRef, *, minutes: int = 15, max_points: int = 300
    ) -> InstanceGpus:
        """The instance's GPUs: newest sample and recent readings (simulated ones flagged)."""
        params = {"minutes": minutes, "max_points": max_points}
        return self._one(InstanceGpus, "GET", f"/instances/{_path_part(ref)}/gpus", params=params)

    def iter_run_events(
        self,
        run_id: int,
        since: str = START,
        *,
        keys: Sequence[str] | None = None,
        logs: bool = True,
        give_up_after: float | None = 600.0,
        retry_delay: float = 0.2,
        max_retry_delay: float = 5.0,
        on_reconnect: ReconnectHook | None = None,
    ) -> Iterator[RunStreamEvent]:
        """Live events of a run until its EndEvent: LogEvent per output chunk, MetricEvent
        per batch of new metric points, StatusEvent per status change, then EndEvent.

        since: a stream position "LOG_SEQ:POINT_ID" ("-1:0": from the start; after
        run_metrics(), f"-1:{metrics.last_point_id}" gives every log chunk but only newer
        points). A dropped connection is resumed from the last event received (the server's
        Last-Event-ID), so nothing is lost or repeated.
        """
        position = since
        params: dict[str, str] = {"logs": "true" if logs else "false"}
        if keys:
            params["keys"] = ",".join(keys)

        def events(lines: Iterator[str]) -> Iterator[RunStreamEvent | None]:
            nonlocal position
            for message in parse_sse_events(lines):
                event = decode_run_event(message)
                if message.id is not None:
                    position = message.id
                yield event

        stream: Iterator[RunStreamEvent] = self._resumable_stream(
            f"/runs/{int(run_id)}/stream",
            f"the event stream of run {run_id}",
            lambda: {**params, "since": position},
            events,
            give_up_after=give_up_after,
            retry_delay=retry_delay,
            max_retry_delay=max_retry_delay,
            on_reconnect=on_reconnect,
        )
        yield from stream

    def _resumable_stream(
        self,
        path: str,
        what: str,
        params: Callable[[], Mapping[str, str | int]],
        read: Callable[[Iterator[str]], Iterator[E | None]],
        *,
        give_up_after: float | None,
        retry_delay: float,
        max_retry_delay: float,
        on_reconnect: ReconnectHook | None,
    ) -> Iterator[E]:
        """GET an event stream and yield what `read` makes of its lines, until an EndEvent.

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
                    self._url(path),
                    params=params(),
                    headers=self._headers({"Accept": "text/event-stream"}),
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
                        if isinstance(event, EndEvent):
                            return
                reason = "the server ended the stream early"
            except httpx.TransportError as exc:
                if certificate_problem(exc) is not None:
                    raise self._transport_error(exc) from exc
                reason = str(self._unreachable(exc).reason)
            except _Retryable as exc:
                reason = str(exc)
            except StreamProtocolError as exc:
                raise self._unexpected(path, exc) from exc
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

    # -- billing ----------------------------------------------------------------------------

    def balance(self) -> Balance:
        return self._one(Balance, "GET", "/balance")

    def usage(self) -> Usage:
        """Usage segments (what was billed, per GPU interval) and the ledger lines."""
        return self._one(Usage, "GET", "/usage")

    def notifications(self) -> list[NotificationPublic]:
        return self._many(NotificationPublic, "/notifications")

    # -- admin ------------------------------------------------------------------------------

    def admin_users(self) -> list[UserPublic]:
        return self._many(UserPublic, "/admin/users")

    def admin_grant(
        self, user: str, amount: str | Decimal, *, memo: str = "admin grant"
    ) -> LedgerLine:
        """Give `user` credit; `amount` is a decimal string ("25.00"), never a float."""
        if isinstance(amount, float):
            raise TypeError("amounts are decimal strings like '25.00', never floats")
        body = {"user": user, "amount": str(amount), "memo": memo}
        return self._one(LedgerLine, "POST", "/admin/grants", body=body)

    # -- plans, vouchers, caps, teams (billing) ---------------------------------------------

    def plans(self, gpu: str) -> list[PlanQuote]:
        """Each plan's price for `gpu` ("A100-80GB:2") and the rules shown before buying."""
        return self._many(PlanQuote, "/plans", params={"gpu": gpu})

    def offpeak_windows(self) -> list[OffPeakPublic]:
        return self._many(OffPeakPublic, "/offpeak")

    def admin_add_offpeak(
        self, weekdays: str, start: str, end: str, discount: str
    ) -> OffPeakPublic:
        body = {"weekdays": weekdays, "start": start, "end": end, "discount": discount}
        return self._one(OffPeakPublic, "POST", "/admin/offpeak", body=body)

    def admin_remove_offpeak(self, window_id: int) -> None:
        self._send("DELETE", f"/admin/offpeak/{int(window_id)}")

    def redeem_voucher(self, code: str) -> Balance:
        return self._one(Balance, "POST", "/vouchers/redeem", body={"code": code})

    def admin_create_voucher(
        self,
        amount: str,
        *,
        code: str | None = None,
        expires_at: str | None = None,
        max_redemptions: int = 1,
        per_user_limit: int = 1,
    ) -> VoucherPublic:
        body = {
            "amount": amount,
            "code": code,
            "expires_at": expires_at,
            "max_redemptions": max_redemptions,
            "per_user_limit": per_user_limit,
        }
        return self._one(VoucherPublic, "POST", "/admin/vouchers", body=body)

    def admin_vouchers(self) -> list[VoucherPublic]:
        return self._many(VoucherPublic, "/admin/vouchers")

    def limits(self) -> LimitsPublic:
        return self._one(LimitsPublic, "GET", "/limits")

    def set_limits(
        self,
        *,
        max_hourly: str | None,
        monthly_budget: str | None,
        low_balance: str | None,
    ) -> LimitsPublic:
        """Your caps as decimal strings; None removes one."""
        body = {
            "max_hourly": max_hourly,
            "monthly_budget": monthly_budget,
            "low_balance": low_balance,
        }
        return self._one(LimitsPublic, "PUT", "/limits", body=body)

    def admin_set_limits(
        self, user: str, *, max_hourly: str | None, monthly_budget: str | None
    ) -> LimitsPublic:
        body = {"max_hourly": max_hourly, "monthly_budget": monthly_budget}
        return self._one(LimitsPublic, "PUT", f"/admin/users/{_path_part(user)}/limits", body=body)

    def team_balance(self, team: str) -> Balance:
        return self._one(Balance, "GET", "/balance", params={"team": team})

    def create_team(self, name: str) -> TeamPublic:
        return self._one(TeamPublic, "POST", "/teams", body={"name": name})

    def teams(self) -> list[TeamPublic]:
        return self._many(TeamPublic, "/teams")

    def team(self, name: str) -> TeamPublic:
        return self._one(TeamPublic, "GET", f"/teams/{_path_part(name)}")

    def set_team_member(self, team: str, user: str, monthly_limit: str | None) -> TeamPublic:
        path = f"/teams/{_path_part(team)}/members/{_path_part(user)}"
        return self._one(TeamPublic, "PUT", path, body={"monthly_limit": monthly_limit})

    def remove_team_member(self, team: str, user: str) -> None:
        self._send("DELETE", f"/teams/{_path_part(team)}/members/{_path_part(user)}")

    def admin_grant_team(
        self, team: str, amount: str | Decimal, *, memo: str = "admin grant"
    ) -> LedgerLine:
        if isinstance(amount, float):
            raise TypeError("amounts are decimal strings like '25.00', never floats")
        body = {"team": team, "amount": str(amount), "memo": memo}
        return self._one(LedgerLine, "POST", "/admin/grants", body=body)

    # -- datasets ---------------------------------------------------------------------------

    def list_datasets(self) -> DatasetList:
        """Your datasets, and your storage use against your quota."""
        return self._one(DatasetList, "GET", "/datasets")

    def get_dataset(self, name: str) -> DatasetDetail:
        """A dataset with its versions, its recent pushes and the instances mounting it."""
        return self._one(DatasetDetail, "GET", f"/datasets/{_path_part(name)}")

    def remove_dataset(self, name: str) -> DatasetRemoved:
        return self._one(DatasetRemoved, "DELETE", f"/datasets/{_path_part(name)}")

    def push_dataset(
        self, directory: Path, name: str, *, progress: PushProgress | None = None
    ) -> PushResult:
        """Push a directory as a new version of dataset `name`; see client/datasets.py."""
        return push_directory(self, directory, name, progress=progress)

    # The push protocol, step by step (push_dataset drives it).

    def start_push(self, name: str, *, files: int, size: int) -> DatasetUploadPublic:
        body = {"name": name, "files": files, "bytes": size}
        return self._one(
            DatasetUploadPublic, "POST", f"/datasets/{_path_part(name)}/pushes", body=body
        )

    def get_push(self, name: str, push_id: int) -> DatasetUploadPublic:
        path = f"/datasets/{_path_part(name)}/pushes/{int(push_id)}"
        return self._one(DatasetUploadPublic, "GET", path)

    def push_files(
        self,
        name: str,
        push_id: int,
        part: int,
        files: Sequence[DatasetFileEntry | Mapping[str, Any]],
    ) -> DatasetMissingChunks:
        """Send part `part` of the file list ({"path", "size", "chunks"} each); the answer
        names the chunks to send."""
        path = f"/datasets/{_path_part(name)}/pushes/{int(push_id)}/files/{int(part)}"
        body = {"files": [f.model_dump() if isinstance(f, BaseModel) else f for f in files]}
        return self._one(DatasetMissingChunks, "PUT", path, body=body)

    def push_chunks(self, name: str, push_id: int, packed: bytes) -> DatasetChunksReceived:
        """Send a chunk pack (gpulease.storage.chunking.pack) of plaintext chunks."""
        path = f"/datasets/{_path_part(name)}/pushes/{int(push_id)}/chunks"
        return self._one(
            DatasetChunksReceived,
            "POST",
            path,
            content=packed,
            headers={"Content-Type": "application/octet-stream"},
        )

    def commit_push(
        self, name: str, push_id: int, *, parts: int, files: int, size: int
    ) -> DatasetPublic:
        path = f"/datasets/{_path_part(name)}/pushes/{int(push_id)}/commit"
        body = {"parts": parts, "files": files, "bytes": size}
        return self._one(DatasetPublic, "POST", path, body=body)

    def abandon_push(self, name: str, push_id: int) -> None:
        self._send("DELETE", f"/datasets/{_path_part(name)}/pushes/{int(push_id)}")

    # -- estimates and statements -----------------------------------------------------------

    def estimate(
        self, model: str, images: int, epochs: int, *, image_size: int = 224, gpus: int = 1
    ) -> EstimatePublic:
        """Expected GPU-hours, wall time, cost and NCU of training an image classifier, for
        every GPU model in the server's catalog (at its prices)."""
        params: dict[str, str | int] = {
            "model": model,
            "images": images,
            "epochs": epochs,
            "image_size": image_size,
            "gpus": gpus,
        }
        return self._one(EstimatePublic, "GET", "/estimate", params=params)

    @staticmethod
    def _period(start: object, end: object, tz: str | None) -> dict[str, str | int]:
        params: dict[str, str | int] = {}
        for key, value in (("from", start), ("to", end), ("tz", tz)):
            if value is not None:
                params[key] = str(value)
        return params

    def statement(
        self,
        start: date | str | None = None,
        end: date | str | None = None,
        *,
        tz: str | None = None,
    ) -> StatementPublic:
        """Your usage from `start` to `end` (dates, both included; default: this month in the
        operator's time zone) by instance, day, GPU model and kind."""
        return self._one(StatementPublic, "GET", "/statement", params=self._period(start, end, tz))

    def statement_csv(
        self,
        start: date | str | None = None,
        end: date | str | None = None,
        *,
        tz: str | None = None,
    ) -> str:
        """The statement's lines as CSV text (what `gpulease statement -o csv` prints)."""
        params = self._period(start, end, tz)
        response = self._send(
            "GET", "/statement.csv", params=params, headers={"Accept": "text/csv"}
        )
        return response.text

    def admin_revenue(
        self,
        start: date | str | None = None,
        end: date | str | None = None,
        *,
        tz: str | None = None,
    ) -> RevenuePublic:
        """Revenue and GPU-hours sold per GPU model per day (admins only)."""
        return self._one(
            RevenuePublic, "GET", "/admin/revenue", params=self._period(start, end, tz)
        )

    def admin_revenue_csv(
        self,
        start: date | str | None = None,
        end: date | str | None = None,
        *,
        tz: str | None = None,
    ) -> str:
        params = self._period(start, end, tz)
        response = self._send(
            "GET", "/admin/revenue.csv", params=params, headers={"Accept": "text/csv"}
        )
        return response.text

    # -- notification channels, support tickets ------------------------------------------------

    def notification_channels(self) -> NotificationChannelsPublic:
        return self._one(NotificationChannelsPublic, "GET", "/notifications/channels")

    def set_notification_channels(self, **fields: object) -> NotificationChannelsPublic:
        """Change only the fields given (webhook_url, email, rotate_secret, ...; see
        NotificationChannelsUpdate); the answer has webhook_secret when one was made."""
        body = NotificationChannelsUpdate.model_validate(fields).model_dump(exclude_unset=True)
        return self._one(NotificationChannelsPublic, "PUT", "/notifications/channels", body=body)

    def mark_notification_read(self, notification_id: int) -> NotificationPublic:
        return self._one(NotificationPublic, "POST", f"/notifications/{notification_id}/read")

    def open_ticket(
        self,
        subject: str,
        body: str,
        *,
        instance: InstanceRef | None = None,
        run_id: int | None = None,
        attach_log: bool = False,
    ) -> SupportTicketDetail:
        """A support ticket; attach_log adds the last 200 lines of run_id's log."""
        request = {
            "subject": subject,
            "body": body,
            "instance": None if instance is None else str(instance),
            "run_id": run_id,
            "attach_log": attach_log,
        }
        return self._one(SupportTicketDetail, "POST", "/support/tickets", body=request)

    def tickets(self) -> list[SupportTicketPublic]:
        """Your tickets (an admin: everyone's), latest activity first."""
        return self._many(SupportTicketPublic, "/support/tickets")

    def ticket(self, ticket_id: int) -> SupportTicketDetail:
        return self._one(SupportTicketDetail, "GET", f"/support/tickets/{ticket_id}")

    def reply_ticket(self, ticket_id: int, body: str) -> SupportTicketDetail:
        return self._one(
            SupportTicketDetail,
            "POST",
            f"/support/tickets/{ticket_id}/messages",
            body={"body": body},
        )

    def close_ticket(self, ticket_id: int) -> SupportTicketDetail:
        return self._one(SupportTicketDetail, "POST", f"/support/tickets/{ticket_id}/close")
