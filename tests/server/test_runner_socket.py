"""The runner socket: a private directory, a 0600 socket, and a probe the launcher trusts."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpulease.server.runner_socket import bind_socket, listening


def test_the_socket_lives_in_a_private_directory_and_replaces_a_stale_one(tmp_path: Path) -> None:
    path = tmp_path / "home" / "run" / "server.sock"
    first = bind_socket(path)
    first.close()  # a server that crashed leaves its socket file behind
    assert path.exists() and not listening(path)

    sock = bind_socket(path)
    try:
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert not listening(path)  # bound, not yet served
        sock.listen()
        assert listening(path)
    finally:
        sock.close()
    assert not listening(tmp_path / "nothing.sock")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand the directory to another user")
def test_a_run_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    os.chown(directory, 65534, 65534)
    with pytest.raises(OSError, match="must be a directory of the server's own user"):
        bind_socket(directory / "server.sock")
