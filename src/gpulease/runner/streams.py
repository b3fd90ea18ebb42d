"""The runner's end of server streams: a shell on a PTY, or a pipe to JupyterLab's socket.

The server lists the streams it wants in the `/runner/v1/commands` answer; for each new id
the runner opens a WebSocket to `/runner/v1/streams/{id}` (outward, with its token) and
bridges it. Binary frames carry bytes both ways; text frames carry JSON control messages:
`{"type": "resize", "cols": 120, "rows": 40}` from the server, `{"type": "exit", "code": 0}`
and `{"type": "error", "message": "..."}` from the runner (then it closes).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import select
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import termios
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import WebSocketException
from websockets.sync.client import ClientConnection, connect, unix_connect

from gpulease.client.trust import pinned_context
from gpulease.runner import safefs
from gpulease.runner.sandbox import Sandbox, SandboxError
from gpulease.schemas.runner import RUNNER_API, RunnerStreamEntry

log = logging.getLogger(__name__)

READ_BYTES = 64 * 1024
MAX_FRAME = 4 * 1024 * 1024
OPEN_TIMEOUT_S = 20.0
MAX_SIZE = 1000  # columns or rows
DEFAULT_COLS, DEFAULT_ROWS = 80, 24
_TERM = "xterm-256color"
_PROMPT = "\\h:\\w\\$ "  # the sandbox has no /etc/bash.bashrc to set one


@dataclass(frozen=True)
class ShellSetup:
    """What a terminal's shell gets: its environment, its working directory, and the
    sandbox it runs in (None: a plain process, for servers run unsandboxed)."""

    env: Mapping[str, str]
    cwd: str
    sandbox: Sandbox | None


class Terminal:
    """`bash -l` on a new PTY (the PTY is its controlling terminal, so job control and
    Ctrl-C work), inside the instance's sandbox when it has one.

    Two threads use `master` (one reads the shell's output, one writes what the user types)
    and others may end the terminal. Closing `master` while they do would free its number for
    the next file opened, another terminal's PTY among them, which they would then read or
    write. So close() hangs up by putting /dev/null in its place (the same number, still
    taken: a read gets end of file, a write goes nowhere), and release() frees the number
    once the threads are done with it."""

    def __init__(self, setup: ShellSetup, cols: int, rows: int) -> None:
        self._ending = threading.Lock()
        self._code: int | None = None
        self._released = False
        self.master, slave = os.openpty()
        try:
            self.resize(cols, rows)
            bash = shutil.which("bash") or "/bin/bash"
            setsid = shutil.which("setsid") or "/usr/bin/setsid"
            # setsid -c makes the PTY the shell's controlling terminal; -w waits for it.
            argv = [setsid, "-w", "-c", bash, "-l"]
            if setup.sandbox is not None:
                argv = setup.sandbox.command(argv, terminal=True)
            env = {"PS1": _PROMPT, **setup.env, "TERM": _TERM}
            self.process = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=setup.cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            os.close(self.master)
            raise
        finally:
            os.close(slave)

    def resize(self, cols: int, rows: int) -> None:
        cols = min(max(cols, 1), MAX_SIZE)
        rows = min(max(rows, 1), MAX_SIZE)
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def close(self) -> int:
        """Hang up and end the shell; its exit code (-N for a signal N). Any thread may call
        it, any number of times: the first hangs up, the others get the same code."""
        with self._ending:
            if self._code is not None:
                return self._code
            # The PTY's last reference goes: the kernel hangs it up (SIGHUP to the shell's
            # session), while the number stays taken by /dev/null until release().
            null = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(null, self.master)
            finally:
                os.close(null)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGHUP)
            try:
                self._code = self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self._code = self.process.wait()
            return self._code

    def release(self) -> None:
        """Free master's number, once close() has hung up and no thread reads or writes it."""
        with self._ending:
            if self._code is None or self._released:
                return
            self._released = True
            os.close(self.master)


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class Streams:
    """Opens and serves the streams the server asks for, each in its own thread."""

    def __init__(
        self,
        server_url: str,
        token: Callable[[], str],
        *,
        shell: Callable[[], ShellSetup],
        jupyter: Callable[[], str] | None = None,
        server_certificate: str | None = None,
        server_socket: Path | None = None,
    ) -> None:
        """token() is the runner's token at the moment (it changes with each session);
        shell() says how to start a terminal; jupyter() starts JupyterLab if needed and
        returns the path of its unix socket (raising RuntimeError with a reason for people
        when it cannot). server_socket: connect there instead of server_url's host and port
        (runner/connection.py)."""
        parts = urlsplit(server_url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        self._base = urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self._token = token
        self._socket = server_socket
        self._shell = shell
        self._jupyter = jupyter
        self._ssl: ssl.SSLContext | None = None
        if scheme == "wss":
            self._ssl = (
                pinned_context(server_certificate)
                if server_certificate
                else ssl.create_default_context()
            )
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._terminals: dict[str, Terminal] = {}
        self._closed = False

    def handle(self, items: Sequence[RunnerStreamEntry]) -> None:
        """The `streams` list of a commands answer: open each id not seen before."""
        for item in items:
            stream_id, kind = item.id, item.kind
            if kind not in ("terminal", "jupyter"):
                log.info("ignoring a stream the runner does not know: %r", item)
                continue
            with self._lock:
                if self._closed or stream_id in self._seen:
                    continue
                self._seen.add(stream_id)
            threading.Thread(
                target=self._serve, args=(stream_id, kind, item), name=f"stream-{kind}", daemon=True
            ).start()

    def close(self) -> None:
        """End every terminal (the instance stops)."""
        with self._lock:
            self._closed = True
            terminals = list(self._terminals.values())
        for terminal in terminals:
            terminal.close()

    def _connect(self, stream_id: str) -> ClientConnection:
        uri = f"{self._base}{RUNNER_API}/streams/{stream_id}"
        headers = {"Authorization": f"Bearer {self._token()}"}
        opened: Callable[..., ClientConnection] = connect
        if self._socket is not None:
            opened = functools.partial(unix_connect, str(self._socket))
        return opened(
            uri,
            additional_headers=headers,
            ssl=self._ssl,
            open_timeout=OPEN_TIMEOUT_S,
            max_size=MAX_FRAME,
            compression=None,
            user_agent_header="gpulease-runner",
        )

    def _serve(self, stream_id: str, kind: str, item: RunnerStreamEntry) -> None:
        try:
            with self._connect(stream_id) as ws:
                if kind == "terminal":
                    self._terminal(stream_id, ws, item)
                else:
                    self._jupyter_pipe(ws)
        except (OSError, WebSocketException, TimeoutError) as exc:
            log.warning("%s stream %s ended: %s", kind, stream_id[:8], exc)
        except Exception:
            log.exception("%s stream failed", kind)

    def _terminal(self, stream_id: str, ws: ClientConnection, item: RunnerStreamEntry) -> None:
        try:
            terminal = Terminal(
                self._shell(),
                _int(item.cols, DEFAULT_COLS),
                _int(item.rows, DEFAULT_ROWS),
            )
        except (OSError, SandboxError) as exc:
            reason = exc.message if isinstance(exc, SandboxError) else str(exc)
            _send_error(ws, f"the terminal could not start: {reason}")
            return
        with self._lock:
            self._terminals[stream_id] = terminal
        log.info("terminal opened (pid %d)", terminal.process.pid)
        reader = threading.Thread(target=self._pump_pty, args=(terminal, ws), daemon=True)
        reader.start()
        try:
            for message in ws:
                if isinstance(message, bytes):
                    _write_all(terminal.master, message)
                else:
                    _control(terminal, message)
        except (OSError, WebSocketException):
            pass  # the shell ended (the reader says so) or the server went away
        finally:
            code = terminal.close()
            with self._lock:
                self._terminals.pop(stream_id, None)
            reader.join(timeout=5)  # it reads /dev/null now: at once at its end
            if reader.is_alive():  # stuck sending: its number stays taken, never reused
                log.warning("terminal %s: its reader did not end", stream_id[:8])
            else:
                terminal.release()
            log.info("terminal closed (exit %d)", code)

    def _pump_pty(self, terminal: Terminal, ws: ClientConnection) -> None:
        """PTY output to the server; when the shell exits, say so and close the socket."""
        try:
            while True:
                ready, _, _ = select.select([terminal.master], [], [], 0.2)
                if not ready:
                    # Without a sandbox a background job may keep the PTY open after the
                    # shell exited; the terminal ends with the shell all the same.
                    if terminal.process.poll() is not None:
                        break
                    continue
                try:
                    data = os.read(terminal.master, READ_BYTES)
                except OSError:  # EIO: the shell and all its children closed the PTY
                    break
                if not data:
                    break
                ws.send(data)
            code = terminal.process.wait()
            ws.send(json.dumps({"type": "exit", "code": code}))
        except (OSError, WebSocketException):
            # The server went away: the socket must end all the same. (Streams.close hangs up
            # every terminal: the read then gets end of file, and the loop ends above.)
            pass
        finally:
            ws.close()

    def _jupyter_pipe(self, ws: ClientConnection) -> None:
        if self._jupyter is None:
            _send_error(ws, "JupyterLab is not available on this runner")
            return
        try:
            path = self._jupyter()
        except RuntimeError as exc:
            _send_error(ws, str(exc))
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            connect_unix(sock, path)
            reader = threading.Thread(target=_pump_socket, args=(sock, ws), daemon=True)
            reader.start()
            try:
                for message in ws:
                    if isinstance(message, bytes):
                        sock.sendall(message)
            except (OSError, WebSocketException):
                pass
            finally:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                reader.join(timeout=5)


def connect_unix(sock: socket.socket, path: str) -> None:
    """Connect to a unix socket whose path may be longer than sun_path allows, never
    through a link the job put at its name (runner/safefs.py)."""
    safefs.connect_unix(sock, path)


def _pump_socket(sock: socket.socket, ws: ClientConnection) -> None:
    try:
        while data := sock.recv(READ_BYTES):
            ws.send(data)
    except (OSError, WebSocketException):
        return
    with contextlib.suppress(OSError, WebSocketException):
        ws.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        select.select([], [fd], [], 5.0)
        written = os.write(fd, view)
        view = view[written:]


def _control(terminal: Terminal, text: str) -> None:
    try:
        message = json.loads(text)
    except ValueError:
        return
    if isinstance(message, dict) and message.get("type") == "resize":
        terminal.resize(
            _int(message.get("cols"), DEFAULT_COLS), _int(message.get("rows"), DEFAULT_ROWS)
        )


def _send_error(ws: ClientConnection, message: str) -> None:
    log.warning("stream refused: %s", message)
    with contextlib.suppress(OSError, WebSocketException):
        ws.send(json.dumps({"type": "error", "message": message}))


def shell_environment(env: dict[str, str], sandbox: Sandbox | None) -> dict[str, str]:
    """A terminal's environment from a run's (runner/jobs.run_env): no run id, and the
    sandbox's view of HOME, PWD and the GPUs when sandboxed."""
    env = {key: value for key, value in env.items() if key != "GPULEASE_RUN_ID"}
    return sandbox.environment(env) if sandbox is not None else env
