"""HTTPS end to end: a self-signed certificate that the CLI pins and runners trust exactly."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulease.client.trust import pem_fingerprint
from processes import ENV_CACHE, Platform, free_port

pytestmark = pytest.mark.e2e

PASSWORD = "password-123"


@pytest.fixture
def tls_platform(tmp_path: Path) -> Iterator[Platform]:
    """One server on HTTPS (SQLite: the transport does not depend on the database)."""
    ENV_CACHE.mkdir(parents=True, exist_ok=True)
    platform = Platform(
        home=tmp_path / "home",
        database_url=f"sqlite:///{tmp_path / 'home' / 'gpulease.db'}",
        port=free_port(),
        simulated="T4:1",
        log_path=tmp_path / "server.log",
        config=tmp_path / "cli-config.json",
        tls=True,
    )
    platform.start()
    try:
        yield platform
    finally:
        platform.end_runners()
        platform.stop()


def test_the_cli_pins_the_certificate_and_refuses_a_changed_one(tls_platform: Platform) -> None:
    p = tls_platform
    assert p.url.startswith("https://")
    fingerprint = pem_fingerprint((p.home / "tls" / "cert.pem").read_text())
    register = ("register", "--server", p.url, "--name", "ann", "--password", PASSWORD)

    unasked = p.cli(*register, check=False)
    assert unasked.returncode == 1
    assert fingerprint in unasked.stdout
    assert "no terminal" in unasked.stderr
    p.extra_env["GPULEASE_TRUST_FINGERPRINT"] = "AB:" * 31 + "AB"
    wrong = p.cli(*register, check=False)
    assert wrong.returncode == 1 and "not the GPULEASE_TRUST_FINGERPRINT" in wrong.stderr
    assert not p.config.exists()  # nothing pinned, nothing sent

    p.extra_env["GPULEASE_TRUST_FINGERPRINT"] = fingerprint.replace(":", "").lower()
    p.cli(*register)
    del p.extra_env["GPULEASE_TRUST_FINGERPRINT"]
    pins = json.loads(p.config.read_text())["trusted_certificates"]
    assert pins == {
        f"127.0.0.1:{p.port}": {
            "fingerprint": fingerprint,
            "certificate": (p.home / "tls" / "cert.pem").read_text(),
        }
    }

    # A whole run over TLS: the CLI to the server, and the runner to the server.
    result = p.cli("run", "--gpu", "T4:1", "--template", "python", "--", "echo over-tls")
    assert result.stdout.strip().endswith("over-tls"), result.stdout
    runner_log = next((p.home / "runners").glob("*/runner.log")).read_text()
    assert "CERTIFICATE_VERIFY_FAILED" not in runner_log

    # The server comes back with another certificate: refused, with both fingerprints.
    p.stop()
    shutil.rmtree(p.home / "tls")
    p.start()
    changed = p.cli("balance", check=False)
    assert changed.returncode == 1
    assert "has CHANGED" in changed.stderr and fingerprint in changed.stderr
    new = pem_fingerprint((p.home / "tls" / "cert.pem").read_text())
    assert new in changed.stderr.replace("\n", "")
    quick = p.cli("run", "--gpu", "T4:1", "--", "echo never", check=False)  # the quick path
    assert quick.returncode == 1 and "has CHANGED" in quick.stderr, quick.stderr

    login = p.cli("login", "--server", p.url, "--name", "ann", "--password", PASSWORD, check=False)
    assert login.returncode == 1 and "has CHANGED" in login.stderr  # the pin holds
    p.cli(
        "login",
        "--server",
        p.url,
        "--name",
        "ann",
        "--password",
        PASSWORD,
        "--replace-certificate",
        "--yes",
    )
    assert p.cli("balance").returncode == 0
