"""Runs: start a command in an instance, read its logs and metrics, follow it live."""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence

from gpulease.client.base import (
    InstanceRef,
    Params,
    ReconnectHook,
    Resource,
    StreamProtocolError,
    path_part,
)
from gpulease.client.errors import ClientError
from gpulease.client.runstream import (
    START,
    EndEvent,
    ExecEvent,
    Follower,
    RunStreamEvent,
)
from gpulease.client.sse import parse_sse
from gpulease.schemas.metrics import RunMetrics, RunsCompared
from gpulease.schemas.runs import ExecStarted, LogPage, RunCreate, RunPublic


class RunsAPI(Resource):
    """`client.runs`: commands run in your instances."""

    def create(self, ref: InstanceRef, body: RunCreate) -> RunPublic:
        """Run `body.command` (a bash script) in the instance's workspace; it waits while the
        instance is queued or starting."""
        return self._api.one(RunPublic, "POST", f"/instances/{path_part(ref)}/runs", body=body)

    def list(self, *, instance_id: int | None = None) -> list[RunPublic]:
        """The newest runs first (at most 100)."""
        params = {"instance_id": instance_id} if instance_id is not None else None
        return self._api.many(RunPublic, "/runs", params=params)

    def get(self, run_id: int) -> RunPublic:
        return self._api.one(RunPublic, "GET", f"/runs/{int(run_id)}")

    def logs(self, run_id: int, after: int = -1, limit: int = 1000) -> LogPage:
        """One page of output: chunks with seq > after; pass `next_after` for the next page."""
        params = {"after": after, "limit": limit}
        return self._api.one(LogPage, "GET", f"/runs/{int(run_id)}/logs", params=params)

    def metrics(
        self, run_id: int, keys: Sequence[str] | None = None, *, max_points: int = 2000
    ) -> RunMetrics:
        """The run's curves, each downsampled to at most max_points (extremes kept; the raw
        points stay on the server: metrics_csv). keys None: every key."""
        params: dict[str, str | int] = {"max_points": max_points}
        if keys:
            params["keys"] = ",".join(keys)
        return self._api.one(RunMetrics, "GET", f"/runs/{int(run_id)}/metrics", params=params)

    def metrics_csv(self, run_id: int) -> str:
        """Every raw point of the run: key,step,value,time,source."""
        return self._api.csv(f"/runs/{int(run_id)}/metrics.csv")

    def compare(
        self, run_ids: Sequence[int], key: str = "loss", *, max_points: int = 1000
    ) -> RunsCompared:
        """One key's curve of each run, to overlay."""
        params: dict[str, str | int] = {
            "ids": ",".join(str(int(i)) for i in run_ids),
            "key": key,
            "max_points": max_points,
        }
        return self._api.one(RunsCompared, "GET", "/runs/compare", params=params)

    def stream(
        self,
        run_id: int,
        since: str = START,
        *,
        logs: bool = True,
        metrics: bool = True,
        keys: Sequence[str] | None = None,
        give_up_after: float | None = 600.0,
        retry_delay: float = 0.2,
        max_retry_delay: float = 5.0,
        on_reconnect: ReconnectHook | None = None,
    ) -> Generator[RunStreamEvent, None, None]:
        """Live events of a run until its EndEvent: LogEvent per output chunk, MetricEvent
        per batch of new metric points (only `keys` when given), StatusEvent per status
        change, then EndEvent. logs=False or metrics=False leaves that kind out.

        since: a stream position "LOG_SEQ:POINT_ID" (runstream.position(); START: from the
        beginning; after metrics(), position(-1, m.last_point_id) gives every log chunk but
        only newer points). A dropped connection (a server restart, a proxy timeout) is
        resumed from the last event received, so nothing is lost or repeated;
        ServerUnreachable only after `give_up_after` seconds without getting anything
        through (None: never).
        """
        follower = Follower(since)
        query: dict[str, str] = {
            "logs": "true" if logs else "false",
            "metrics": "true" if metrics else "false",
        }
        if keys:
            query["keys"] = ",".join(keys)

        def params() -> Params:
            return {**query, "since": follower.cursor}

        def events(lines: Iterator[str]) -> Iterator[RunStreamEvent | None]:
            for message in parse_sse(lines):
                yield follower.take(message)

        return self._api.resumable_stream(
            f"/runs/{int(run_id)}/stream",
            f"the event stream of run {run_id}",
            params,
            events,
            lambda event: isinstance(event, EndEvent),
            give_up_after=give_up_after,
            retry_delay=retry_delay,
            max_retry_delay=max_retry_delay,
            on_reconnect=on_reconnect,
        )

    def exec(
        self, ref: InstanceRef, body: RunCreate, *, on_reconnect: ReconnectHook | None = None
    ) -> Generator[ExecEvent | RunStreamEvent, None, None]:
        """Run `body.command` in the instance and follow it, in one request: first an
        ExecEvent (the run, and whether its instance was running), then the run's events
        as stream() gives them with metrics=False, until its EndEvent. A refusal raises
        before anything is yielded. A broken answer is resumed with stream() from the last
        event, never by posting again (that would start the command twice)."""
        path = f"/instances/{path_part(ref)}/exec"
        follower = Follower()
        run_id: int | None = None
        for message in parse_sse(self._api.post_events(path, body)):
            if message.event == "run" and run_id is None:
                started = self._api.parse(ExecStarted, path, message.data)
                run_id = started.run.id
                yield ExecEvent(started)
                continue
            try:
                event = follower.take(message)
            except StreamProtocolError as exc:
                raise self._api.unexpected(path, exc) from exc
            if event is not None:
                yield event
                if isinstance(event, EndEvent):
                    return
        if run_id is None:
            raise ClientError(
                f"the server at {self._api.server_url} ended the exec before naming its run; "
                "`gpulease runs` shows whether it started"
            )
        yield from self.stream(run_id, follower.cursor, metrics=False, on_reconnect=on_reconnect)
