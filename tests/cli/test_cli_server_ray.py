"""`gpulease server --backend ray`: what it refuses, in words that say what to do."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpulease.cli.main import app


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("DATABASE_URL", "BACKEND", "RAY_ADDRESS", "ENVIRONMENT", "PUBLIC_URL"):
        monkeypatch.delenv(f"GPULEASE_{name}", raising=False)
    monkeypatch.setenv("GPULEASE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPULEASE_UNSANDBOXED_SINGLE_USER", "true")  # no bwrap check needed
    monkeypatch.setenv("COLUMNS", "200")


def test_the_ray_backend_needs_an_address() -> None:
    result = CliRunner().invoke(app, ["server", "--backend", "ray"])
    assert result.exit_code == 2
    assert "GPULEASE_BACKEND=ray needs the cluster's address" in result.stderr
    assert "--ray-address HOST:PORT" in result.stderr


def test_an_unknown_backend_is_refused() -> None:
    result = CliRunner().invoke(app, ["server", "--backend", "slurm"])
    assert result.exit_code == 2
    assert "GPULEASE_BACKEND" in result.stderr and "'local' or 'ray'" in result.stderr


def test_a_cluster_that_is_not_there_is_refused_at_once() -> None:
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'gpulease[ray]'")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = CliRunner().invoke(
        app, ["server", "--backend", "ray", "--ray-address", f"127.0.0.1:{port}"]
    )
    assert result.exit_code == 2
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in result.stderr
    assert "ray start --head" in result.stderr
