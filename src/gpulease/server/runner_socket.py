"""The server's Unix socket for the runners of this node, served beside its TCP port.

A job shares nothing with that socket: it lives in `GPULEASE_HOME/run/` (mode 0700, owned by
the server's user), which no sandbox binds, so a job can neither connect to it nor put its
own listener in its place. The local backend's runners talk to the server only through it
(RunnerSpec.server_socket), so a job that binds the server's TCP port while the server
restarts receives no runner call, token or command. Remote runners keep HTTPS with the pinned
certificate (server/tls.py).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import stat
import sys
from pathlib import Path
from typing import Any

from gpulease.server.settings import Settings

log = logging.getLogger(__name__)

RUN_DIR = "run"
SOCKET_FILE = "server.sock"
STARTUP_FAILURE = 3  # uvicorn's exit code when the server could not start
_CONNECT_TIMEOUT_S = 1.0


def socket_path(settings: Settings) -> Path:
    return settings.home / RUN_DIR / SOCKET_FILE


def bind_socket(path: Path) -> socket.socket:
    """An AF_UNIX socket bound at path (uvicorn listens on it). Its directory is made 0700 and
    must belong to this process's user; a socket file left by an earlier server is replaced.
    Raises OSError (with the path) when it cannot be made."""
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise OSError(f"{directory} must be a directory of the server's own user")
    os.chmod(directory, 0o700)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {path}: {exc}") from exc
    finally:
        os.umask(umask)
    os.chmod(path, 0o600)
    return sock


def listening(path: Path) -> bool:
    """True when a server accepts connections on path now: the launcher hands runners the
    socket only then (a server run without it, as in tests, keeps TCP)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(_CONNECT_TIMEOUT_S)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def serve(app: Any, settings: Settings, **options: Any) -> None:
    """uvicorn.run(app, host=settings.host, port=settings.port, **options), also listening on
    the runner socket (with the same TLS, if any). A socket that cannot be made is logged and
    left out: runners then use TCP."""
    import uvicorn

    config = uvicorn.Config(app, host=settings.host, port=settings.port, **options)
    server = uvicorn.Server(config)
    path = socket_path(settings)
    sockets = [config.bind_socket()]
    try:
        sockets.append(bind_socket(path))
    except OSError as exc:
        log.warning("runners on this node will use TCP: %s", exc)
    # What exists now (the modules, the app, the runtime) lives as long as the server: frozen
    # out of the collector's reach, the full collections that a request's objects set off (a
    # file list part of 5,000 files makes tens of thousands) go only through what requests
    # made, instead of every object of the process each time (about 0.1 s a collection).
    gc.freeze()
    try:
        server.run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
        if len(sockets) > 1:
            with contextlib.suppress(OSError):
                path.unlink()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
