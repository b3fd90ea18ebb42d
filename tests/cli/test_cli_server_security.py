"""`gpulease server` and isolation and HTTPS: refuse without a sandbox, say so loudly, serve TLS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpulease.cli.main import app
from gpulease.client.trust import pem_fingerprint
from gpulease.runner import sandbox
from gpulease.server.settings import Settings


def test_without_a_working_bwrap_the_server_refuses_to_start(
    served: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sandbox, "BWRAP", str(tmp_path / "no-bwrap"))
    monkeypatch.setenv("PATH", str(tmp_path))

    result = CliRunner().invoke(app, ["server"])

    assert result.exit_code == 2
    assert result.stderr.startswith("error: refusing to start")
    assert "bubblewrap (bwrap) is not installed" in result.stderr
    assert "GPULEASE_UNSANDBOXED_SINGLE_USER=true" in result.stderr
    assert served == []


def test_the_single_user_flag_runs_unsandboxed_loudly_without_sign_up(
    served: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sandbox, "BWRAP", str(tmp_path / "no-bwrap"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("GPULEASE_UNSANDBOXED_SINGLE_USER", "true")
    monkeypatch.setenv("GPULEASE_SIGNUP_ENABLED", "true")

    result = CliRunner().invoke(app, ["server"])

    assert result.exit_code == 0, result.output
    assert "UNSANDBOXED SINGLE-USER MODE" in result.stdout
    assert "sign-up is off" in result.stdout
    assert len(served) == 1
    assert Settings().signup_enabled is False


def test_a_self_signed_certificate_is_made_once_and_served(
    served: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPULEASE_TLS_SELF_SIGNED", "true")
    tls = tmp_path / "home" / "tls"

    first = CliRunner().invoke(app, ["server", "--port", "9443"])

    assert first.exit_code == 0, first.output
    cert = (tls / "cert.pem").read_text()
    assert (tls / "key.pem").stat().st_mode & 0o777 == 0o600
    assert "https://127.0.0.1:9443" in first.stdout
    assert pem_fingerprint(cert) in first.stdout
    assert served[0]["ssl_certfile"] == str(tls / "cert.pem")
    assert served[0]["ssl_keyfile"] == str(tls / "key.pem")
    assert Settings().runner_url == "https://127.0.0.1:8420"

    again = CliRunner().invoke(app, ["server"])
    assert again.exit_code == 0
    assert (tls / "cert.pem").read_text() == cert  # kept, so pinned clients keep working


def test_bad_tls_settings_are_refused(
    served: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPULEASE_TLS_CERT", str(tmp_path / "cert.pem"))
    lonely = CliRunner().invoke(app, ["server"])
    assert lonely.exit_code == 2 and "GPULEASE_TLS_KEY go together" in lonely.stderr

    (tmp_path / "cert.pem").write_text("not a certificate")
    (tmp_path / "key.pem").write_text("not a key")
    monkeypatch.setenv("GPULEASE_TLS_KEY", str(tmp_path / "key.pem"))
    broken = CliRunner().invoke(app, ["server"])
    assert broken.exit_code == 2
    assert f"cannot serve HTTPS with certificate {tmp_path / 'cert.pem'}" in broken.stderr
    assert served == []
