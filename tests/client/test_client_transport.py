"""The SDK's HTTP edges: error decoding, unreachable servers, and run-stream reconnects."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import httpx
import pytest
from inprocess import SERVER_URL, InProcessServer

from gpulease.client import (
    ApiError,
    ClientError,
    EndEvent,
    GpuleaseClient,
    LogEvent,
    ServerUnreachable,
    StatusEvent,
)
from gpulease.client.sse import SseMessage, parse_sse
from gpulease.schemas.instances import InstanceCreate
from gpulease.schemas.runs import RunCreate

NOW = datetime(2026, 1, 1, tzinfo=UTC).isoformat()


def mock_client(handler: Callable[[httpx.Request], httpx.Response]) -> GpuleaseClient:
    return GpuleaseClient(
        "http://gpu-box:8420/", "glp_secret", transport=httpx.MockTransport(handler)
    )


def run_json(status: str, exit_code: int | None = None) -> str:
    return json.dumps(
        {
            "id": 7,
            "instance_id": 1,
            "command": "python train.py",
            "status": status,
            "status_reason": "",
            "exit_code": exit_code,
            "created_at": NOW,
            "started_at": NOW,
            "finished_at": None,
        }
    )


def log_event(seq: int) -> str:
    chunk = {"seq": seq, "stream": "stdout", "data": f"line {seq}\n", "time": NOW}
    return f"id: {seq}:0\nevent: log\ndata: {json.dumps(chunk)}\n\n"


def status_event(status: str) -> str:
    return f"event: status\ndata: {run_json(status)}\n\n"


def end_event(status: str, exit_code: int | None) -> str:
    return f"event: end\ndata: {json.dumps({'status': status, 'exit_code': exit_code})}\n\n"


def dropping(*parts: str) -> Iterator[bytes]:
    """A response body that sends parts, then loses the connection."""
    for part in parts:
        yield part.encode()
    raise httpx.ReadError("connection reset by peer")


def test_requests_carry_the_token_and_use_the_api_prefix() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=[])

    with mock_client(handler) as client:
        assert client.catalog.gpus() == []
    assert str(seen[0].url) == "http://gpu-box:8420/api/v1/gpus"
    assert seen[0].headers["authorization"] == "Bearer glp_secret"


@pytest.mark.parametrize(
    ("response", "status", "message"),
    [
        (httpx.Response(404, json={"detail": "you have no run 3"}), 404, "you have no run 3"),
        (httpx.Response(405, json={"detail": "Method Not Allowed"}), 405, "Method Not Allowed"),
        (
            httpx.Response(502, text="<html>Bad Gateway</html>"),
            502,
            "the server failed (502 Bad Gateway); the server's log has the cause",
        ),
        (
            httpx.Response(418, text=""),
            418,
            "the server refused the request (418 I'm a teapot)",
        ),
        (
            httpx.Response(422, json={"detail": [{"msg": "field required"}]}),
            422,
            '[{"msg": "field required"}]',
        ),
    ],
)
def test_errors_become_api_errors_with_the_detail_text(
    response: httpx.Response, status: int, message: str
) -> None:
    with mock_client(lambda request: response) as client, pytest.raises(ApiError) as refused:
        client.billing.balance()
    assert (refused.value.status, refused.value.message) == (status, message)


def test_an_answer_of_the_wrong_shape_is_a_clear_client_error() -> None:
    with mock_client(lambda r: httpx.Response(200, json={"nope": 1})) as client:
        with pytest.raises(ClientError, match="unexpected answer from http://gpu-box:8420"):
            client.billing.balance()
        with pytest.raises(ClientError, match="unexpected answer"):
            client.catalog.gpus()


def test_timeouts_and_refused_connections_say_which_server() -> None:
    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    with mock_client(timeout) as client, pytest.raises(ServerUnreachable) as slow:
        client.auth.me()
    assert slow.value.message == (
        "cannot reach the gpulease server at http://gpu-box:8420: no answer within 30 s"
    )
    with mock_client(refused) as client, pytest.raises(ServerUnreachable, match="refused"):
        client.auth.me()


def test_sse_parser_drops_comments_and_unterminated_messages() -> None:
    lines = [": keep-alive", "", "event: log", "data: a", "data: b", "", "event: end", "data: x"]
    assert list(parse_sse(lines)) == [SseMessage(None, "log", "a\nb")]


def test_run_stream_resumes_after_a_dropped_connection_without_loss_or_repeats() -> None:
    calls: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.params.get("since"))
        if len(calls) == 1:
            body = dropping(status_event("running"), log_event(0), log_event(1), "event: log\nda")
            return httpx.Response(200, content=body)
        # the server replays from `since`; a repeat of seq 1 must still not be shown twice
        body = iter(
            [
                (status_event("running") + log_event(1) + log_event(2)).encode(),
                (status_event("succeeded") + end_event("succeeded", 0)).encode(),
            ]
        )
        return httpx.Response(200, content=body)

    reconnects: list[str] = []
    with mock_client(handler) as client:
        events = list(
            client.runs.stream(
                7, retry_delay=0, on_reconnect=lambda why, d: reconnects.append(why), metrics=False
            )
        )
    assert calls == ["-1:0", "1:0"]
    assert [e.chunk.seq for e in events if isinstance(e, LogEvent)] == [0, 1, 2]
    assert [e.run.status for e in events if isinstance(e, StatusEvent)] == [
        "running",
        "succeeded",
    ]
    assert events[-1] == EndEvent("succeeded", 0)
    assert reconnects == ["connection reset by peer"]


def test_run_stream_waits_out_a_restarting_server_and_a_proxy_502() -> None:
    answers: list[Callable[[httpx.Request], httpx.Response]] = [
        lambda r: (_ for _ in ()).throw(httpx.ConnectError("refused", request=r)),
        lambda r: httpx.Response(502, text="bad gateway"),
        lambda r: httpx.Response(200, content=status_event("running").encode()),  # early end
        lambda r: httpx.Response(200, content=(log_event(0) + end_event("failed", 2)).encode()),
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        return answers.pop(0)(request)

    with mock_client(handler) as client:
        events = list(client.runs.stream(7, retry_delay=0, metrics=False))
    assert answers == []
    assert events[-1] == EndEvent("failed", 2)
    assert [e.chunk.data for e in events if isinstance(e, LogEvent)] == ["line 0\n"]


def test_run_stream_gives_up_after_its_deadline_and_not_on_refusals() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with mock_client(down) as client, pytest.raises(ServerUnreachable, match="reconnecting"):
        list(client.runs.stream(7, retry_delay=0, give_up_after=0, metrics=False))

    tries: list[int] = []

    def gone(request: httpx.Request) -> httpx.Response:
        tries.append(1)
        return httpx.Response(404, json={"detail": "you have no run 7"})

    with mock_client(gone) as client, pytest.raises(ApiError, match="no run 7"):
        list(client.runs.stream(7, retry_delay=0, metrics=False))
    assert len(tries) == 1


class _CutFirstStream(httpx.BaseTransport):
    """Passes requests to the in-process app, but cuts the first run stream after its
    first `log` event, as a server restart would."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self.cut = False
        self.stream_afters: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if not request.url.path.endswith("/stream"):
            return response
        self.stream_afters.append(request.url.params.get("since"))
        if self.cut:
            return response
        self.cut = True
        inner_stream = response.stream
        assert isinstance(inner_stream, httpx.SyncByteStream)

        def body() -> Iterator[bytes]:
            seen = b""
            try:
                for part in inner_stream:
                    seen += part
                    yield part
                    if b"event: log" in seen and seen.endswith(b"\n\n"):
                        raise httpx.RemoteProtocolError("server disconnected")
            finally:
                inner_stream.close()

        return httpx.Response(response.status_code, headers=response.headers, content=body())


def test_run_stream_survives_a_cut_stream_from_the_real_server(server: InProcessServer) -> None:
    ann = server.user()
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    server.cluster.job = lambda run: ([("stdout", f"{i}\n") for i in range(5)], 0)
    run = ann.runs.create("box", RunCreate(command="python train.py"))
    server.cluster.start()
    server.cluster.wait_for(lambda: ann.runs.get(run.id).status == "succeeded")

    cutter = _CutFirstStream(server.http._transport)
    with GpuleaseClient(SERVER_URL, ann.token, transport=cutter) as client:
        events = list(client.runs.stream(run.id, retry_delay=0, metrics=False))
    assert [e.chunk.data for e in events if isinstance(e, LogEvent)] == [f"{i}\n" for i in range(5)]
    assert events[-1] == EndEvent("succeeded", 0)
    assert cutter.stream_afters[0] == "-1:0" and len(cutter.stream_afters) == 2
    assert cutter.stream_afters[1] != "-1:0"
