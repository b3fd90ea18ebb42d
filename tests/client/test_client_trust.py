"""Trusting servers: fingerprints, pins kept in the config, and real TLS handshakes."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulease.client import Login, save_login
from gpulease.client.config import (
    TrustedCertificate,
    forget_token,
    load_saved,
    pin_certificate,
    trusted_certificate,
)
from gpulease.client.trust import (
    fetch_certificate,
    normalize_fingerprint,
    pem_fingerprint,
    pinned_context,
)
from gpulease.server.tls import generate_self_signed


def make_cert(directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "cert.pem", directory / "key.pem"
    generate_self_signed(cert, key, ["localhost", "127.0.0.1"])
    return cert, key


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A TLS listener on loopback with a fresh self-signed certificate (handshakes only)."""
    cert, key = make_cert(tmp_path / "server")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            try:
                with context.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{listener.getsockname()[1]}", cert
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def handshake(url: str, context: ssl.SSLContext) -> None:
    port = int(url.rsplit(":", 1)[1])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
        context.wrap_socket(sock, server_hostname="127.0.0.1"),
    ):
        pass


def test_fingerprints_are_written_one_way() -> None:
    hexes = "ab" * 32
    expected = ":".join(["AB"] * 32)
    assert normalize_fingerprint(hexes) == expected
    assert normalize_fingerprint(f"SHA256:{expected.lower()}") == expected
    assert normalize_fingerprint("AB:CD") is None
    assert normalize_fingerprint("zz" * 32) is None


def test_a_self_signed_server_is_seen_and_pinned_exactly(
    tls_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, cert = tls_server
    presented = fetch_certificate(url)
    assert presented.ca_verified is False
    assert presented.fingerprint == pem_fingerprint(cert.read_text())

    handshake(url, pinned_context(presented.pem))
    other, _ = make_cert(tmp_path / "other")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(url, pinned_context(other.read_text()))


def test_pins_live_beside_the_login_and_survive_it(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    url = "https://gpu-box:8420"
    pin = TrustedCertificate(fingerprint="AB:CD", pem="-----BEGIN CERTIFICATE-----")
    save_login(Login(server=url, token="t0k", user="ann"), config)
    pin_certificate(url, pin, config)

    assert trusted_certificate(url, config) == pin
    assert trusted_certificate("https://gpu-box:8421", config) is None
    assert trusted_certificate("http://gpu-box:8420", config) is None
    save_login(Login(server=url, token="new", user="ann"), config)
    forget_token(config)
    assert trusted_certificate(url + "/", config) == pin
    assert load_saved(config) == Login(server=url)
    assert config.stat().st_mode & 0o777 == 0o600

    pin_certificate(url, None, config)
    assert trusted_certificate(url, config) is None
