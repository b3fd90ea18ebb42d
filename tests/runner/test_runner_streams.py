"""The runner's end of terminal and Jupyter streams, against a stand-in server socket."""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Server, ServerConnection, serve, unix_serve

from gpulease.runner.sandbox import Sandbox, base_environment, probe
from gpulease.runner.streams import ShellSetup, Streams, Terminal, shell_environment
from gpulease.schemas.runner import RunnerStreamEntry

TOKEN = "runner-token"


def entries(*items: dict[str, object]) -> list[RunnerStreamEntry]:
    """A commands answer's `streams` list, as the runner reads it."""
    return [RunnerStreamEntry.model_validate(item) for item in items]


class StandIn:
    """A WebSocket server playing the gpulease server's /runner/v1/streams/{id}."""

    def __init__(self, unix_path: Path | None = None) -> None:
        """On a TCP port of 127.0.0.1, or on the Unix socket unix_path."""
        self.connections: queue.Queue[tuple[str, str, ServerConnection]] = queue.Queue()
        self._stop = threading.Event()
        if unix_path is None:
            self._server: Server = serve(self._handler, "127.0.0.1", 0)
            self.port = self._server.socket.getsockname()[1]
        else:
            self._server = unix_serve(self._handler, str(unix_path))
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        self.connections.put((ws.request.path, ws.request.headers["Authorization"], ws))
        self._stop.wait(60)  # the test talks to ws from its own thread

    def next(self) -> tuple[str, str, ServerConnection]:
        return self.connections.get(timeout=20)

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    yield server
    server.close()


def read_until(
    ws: ServerConnection, needle: bytes, timeout: float = 20, seen: bytes = b""
) -> bytes:
    """What the terminal sent until needle, starting from what was already seen of it
    (a needle may arrive in the same message as the one read for before)."""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        message = ws.recv(timeout=max(deadline - time.monotonic(), 0.01))
        if isinstance(message, bytes):
            seen += message
    return seen


def shell_setup(tmp_path: Path, sandboxed: bool) -> ShellSetup:
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    env = {**base_environment(os.environ), "GPULEASE_RUN_ID": "0", "MARK": "from-runner"}
    jail = None
    if sandboxed:
        venv = tmp_path / "venv"
        venv.mkdir(exist_ok=True)
        (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
        jail = Sandbox(workspace=workspace, env_dir=venv, hostname="gpulease-7")
    return ShellSetup(shell_environment(env, jail), str(workspace), jail)


@pytest.mark.parametrize("sandboxed", [False, True], ids=["plain", "sandboxed"])
def test_a_terminal_runs_a_shell_on_a_pty_and_reports_its_exit(
    stand_in: StandIn, tmp_path: Path, sandboxed: bool
) -> None:
    if sandboxed and (reason := probe()) is not None:
        pytest.skip(f"bubblewrap cannot sandbox here: {reason}")
    setup = shell_setup(tmp_path, sandboxed)
    streams = Streams(f"http://127.0.0.1:{stand_in.port}", lambda: TOKEN, shell=lambda: setup)
    item = {"id": "s1", "kind": "terminal", "cols": 77, "rows": 20}
    streams.handle(entries(item, {"id": "x", "kind": "teleport"}))
    streams.handle(entries(item))  # the same id again: not opened twice
    path, auth, ws = stand_in.next()
    assert path == "/runner/v1/streams/s1" and auth == f"Bearer {TOKEN}"
    ws.send(b"stty size; echo $MARK-${GPULEASE_RUN_ID:-none}; tty -s && echo tty-$((6*7))\r")
    out = read_until(ws, b"tty-42\r\n")
    assert b"20 77" in out and b"from-runner-none" in out
    ws.send(json.dumps({"type": "resize", "cols": 90, "rows": 33}))
    ws.send(b"stty size; hostname\r")
    out = read_until(ws, b"33 90")
    if sandboxed:  # the hostname comes after the size, maybe in the same message
        read_until(ws, b"gpulease-7", seen=out.split(b"33 90", 1)[1])
    ws.send(b"sleep 1000 & exit 3\r")  # a leftover job does not keep the terminal open
    messages: list[Any] = []
    while True:
        try:
            messages.append(ws.recv(timeout=20))
        except ConnectionClosed:
            break
    assert json.loads(messages[-1]) == {"type": "exit", "code": 3}
    with pytest.raises(queue.Empty):
        stand_in.connections.get(timeout=0.2)


def test_streams_go_over_the_servers_socket_with_the_current_token(
    stand_in: StandIn, tmp_path: Path
) -> None:
    """With the server's Unix socket, a stream never reaches whatever listens at server_url
    (here the TCP stand-in, playing a job's listener), and carries the token of the moment."""
    socket_dir = Path(tempfile.mkdtemp(prefix="streams-", dir="/tmp"))  # AF_UNIX: short paths
    real = StandIn(socket_dir / "server.sock")
    tokens = iter(["glr_first", "glr_second"])
    current = next(tokens)
    try:
        setup = shell_setup(tmp_path, sandboxed=False)
        streams = Streams(
            f"http://127.0.0.1:{stand_in.port}",
            lambda: current,
            shell=lambda: setup,
            server_socket=socket_dir / "server.sock",
        )
        streams.handle(entries({"id": "u1", "kind": "terminal"}))
        path, auth, ws = real.next()
        assert (path, auth) == ("/runner/v1/streams/u1", "Bearer glr_first")
        current = next(tokens)  # a new session
        streams.handle(entries({"id": "u2", "kind": "terminal"}))
        assert real.next()[:2] == ("/runner/v1/streams/u2", "Bearer glr_second")
        streams.close()
        with pytest.raises(queue.Empty):
            stand_in.connections.get(timeout=0.5)
    finally:
        real.close()
        shutil.rmtree(socket_dir, ignore_errors=True)


def test_a_terminal_ended_twice_never_closes_a_file_opened_in_between(tmp_path: Path) -> None:
    """Streams.close and the terminal's own thread may both end it. The first hangs up and
    keeps the PTY's number taken (by /dev/null) until release(), so a file opened meanwhile
    (another terminal's PTY, say) gets another number, and the second end leaves it alone."""
    terminal = Terminal(shell_setup(tmp_path, sandboxed=False), 80, 24)
    master = terminal.master
    code = terminal.close()
    assert os.readlink(f"/proc/self/fd/{master}") == "/dev/null"
    assert terminal.process.poll() is not None
    other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)
    try:
        assert other != master
        assert terminal.close() == code
        os.fstat(other)  # still open
        terminal.release()
        terminal.release()
        assert not os.path.exists(f"/proc/self/fd/{master}")
        os.fstat(other)
    finally:
        os.close(other)


def test_closing_the_streams_ends_open_terminals(stand_in: StandIn, tmp_path: Path) -> None:
    setup = shell_setup(tmp_path, sandboxed=False)
    streams = Streams(f"http://127.0.0.1:{stand_in.port}", lambda: TOKEN, shell=lambda: setup)
    streams.handle(entries({"id": "s2", "kind": "terminal"}))
    _, _, ws = stand_in.next()
    ws.send(b"echo ready-$((6*7))\r")
    read_until(ws, b"ready-42\r\n")
    streams.close()
    with pytest.raises(ConnectionClosed):
        while True:
            ws.recv(timeout=20)
    streams.handle(entries({"id": "s3", "kind": "terminal"}))  # closed: nothing new opens
    with pytest.raises(queue.Empty):
        stand_in.connections.get(timeout=0.2)


def test_jupyter_streams_pipe_bytes_to_the_socket_or_say_why_not(
    stand_in: StandIn, tmp_path: Path
) -> None:
    # A long socket path (over sun_path's 108 bytes) still connects.
    directory = tmp_path / ("d" * 60) / ("e" * 60)
    directory.mkdir(parents=True)
    path = directory / "lab.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    listener.bind(f"/proc/self/fd/{fd}/lab.sock")
    os.close(fd)
    listener.listen(1)
    answers = iter([str(path), RuntimeError("JupyterLab could not be installed: no PyPI")])

    def jupyter() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    setup = shell_setup(tmp_path, sandboxed=False)
    streams = Streams(
        f"http://127.0.0.1:{stand_in.port}", lambda: TOKEN, shell=lambda: setup, jupyter=jupyter
    )
    streams.handle(entries({"id": "j1", "kind": "jupyter"}))
    _, _, ws = stand_in.next()
    ws.send(b"GET /api/status HTTP/1.1\r\n\r\n")
    conn, _ = listener.accept()
    with conn:
        assert conn.recv(1024) == b"GET /api/status HTTP/1.1\r\n\r\n"
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        assert ws.recv(timeout=20) == b"HTTP/1.1 200 OK\r\n\r\n"
    with pytest.raises(ConnectionClosed):  # JupyterLab closed its end: so does the stream
        ws.recv(timeout=20)
    listener.close()

    streams.handle(entries({"id": "j2", "kind": "jupyter"}))
    _, _, ws = stand_in.next()
    assert json.loads(ws.recv(timeout=20)) == {
        "type": "error",
        "message": "JupyterLab could not be installed: no PyPI",
    }
