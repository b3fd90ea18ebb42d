"""Which server certificates the SDK, the CLI and runners trust.

A certificate signed by an authority this computer trusts is verified as usual. A server
with a self-signed certificate is trusted the way SSH trusts a host: at the first login the
CLI shows the certificate's SHA-256 fingerprint, the user confirms it, and from then on that
certificate, and only it, is trusted for that server (the CLI config keeps it). A different
certificate later is refused with CertificateChanged.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import urlsplit

from gpulease.client.errors import ClientError

if TYPE_CHECKING:
    import ssl

# ssl, hashlib and socket are imported where they are used: the CLI's quick path reads the
# pinned certificate from here and needs none of them for a plain http server.

FINGERPRINT_ENV = "GPULEASE_TRUST_FINGERPRINT"
HANDSHAKE_TIMEOUT_S = 10.0
_HEX = re.compile(r"^[0-9A-F]{64}$")


class UntrustedCertificate(ClientError):
    """The server's certificate is neither signed by a trusted authority nor pinned."""


class CertificateChanged(ClientError):
    """The server shows another certificate than the one pinned for it."""


def certificate_fingerprint(der: bytes) -> str:
    """SHA-256 of a DER certificate as `AB:CD:…` (how `openssl x509 -fingerprint -sha256`
    and browsers show it)."""
    import hashlib

    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def pem_fingerprint(pem: str) -> str:
    import ssl

    return certificate_fingerprint(ssl.PEM_cert_to_DER_cert(pem))


def normalize_fingerprint(text: str) -> str | None:
    """'sha256:abcd…', 'AB:CD:…' or plain hex -> 'AB:CD:…'; None when it is not a SHA-256."""
    raw = text.strip().upper().removeprefix("SHA256:").removeprefix("SHA-256:")
    raw = re.sub(r"[\s:]", "", raw)
    if not _HEX.match(raw):
        return None
    return ":".join(raw[i : i + 2] for i in range(0, len(raw), 2))


def pinned_context(pem: str) -> ssl.SSLContext:
    """A client context that trusts exactly this certificate and nothing else. The host
    name is not checked: the pinned certificate is the server's identity, whatever name
    or address reaches it."""
    import ssl

    context = ssl.create_default_context(cadata=pem)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def ca_context() -> ssl.SSLContext:
    """A client context that verifies servers against the CAs httpx trusts by default
    (httpx.create_ssl_context): SSL_CERT_FILE, else SSL_CERT_DIR, else certifi's bundle."""
    import ssl

    import certifi

    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    return ssl.create_default_context(cafile=certifi.where())


def address(url: str) -> str:
    """host:port of an https URL, the key a pin is stored under."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    return f"{host}:{parts.port or 443}"


class PresentedCertificate(NamedTuple):
    """What a server showed in a handshake; `ca_verified` when a trusted authority signed
    it for the host name in the URL."""

    pem: str
    fingerprint: str
    ca_verified: bool


def fetch_certificate(url: str, timeout: float = HANDSHAKE_TIMEOUT_S) -> PresentedCertificate:
    """Handshake with an https server, sending nothing, and report its certificate."""
    import socket
    import ssl

    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or 443
    verifying = ca_context()
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as sock,
            verifying.wrap_socket(sock, server_hostname=host) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
            verified = True
    except ssl.SSLCertVerificationError:
        verified = False
        der = _unverified_certificate(host, port, timeout)
    except (OSError, ssl.SSLError) as exc:
        raise ClientError(f"cannot make a TLS connection to {url}: {exc}") from exc
    if not der:
        raise ClientError(f"{url} showed no certificate")
    return PresentedCertificate(
        pem=ssl.DER_cert_to_PEM_cert(der),
        fingerprint=certificate_fingerprint(der),
        ca_verified=verified,
    )


def _unverified_certificate(host: str, port: int, timeout: float) -> bytes | None:
    import socket
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as sock,
            context.wrap_socket(sock, server_hostname=host) as tls,
        ):
            return tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError) as exc:
        raise ClientError(f"cannot make a TLS connection to {host}:{port}: {exc}") from exc


def certificate_problem(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind an error (httpx's or the standard
    library's), if that is what it is (none can be while ssl was never loaded)."""
    if "ssl" not in sys.modules:
        return None
    import ssl

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def changed_message(url: str, pinned_fingerprint: str) -> str:
    """What to tell a user whose pinned server now shows another certificate."""
    try:
        now = fetch_certificate(url).fingerprint
    except ClientError:
        now = "(could not be read)"
    return (
        f"the certificate of {url} has CHANGED since you trusted it: pinned SHA-256 "
        f"{pinned_fingerprint}, the server now shows {now}. Someone may be intercepting the "
        "connection; nothing was sent. If the operator did replace the certificate, check "
        f"the new fingerprint with them and run `gpulease login --server {url} "
        "--replace-certificate`"
    )


def untrusted_message(url: str) -> str:
    return (
        f"the certificate of {url} is not signed by an authority this computer trusts, and "
        f"none is pinned for it; run `gpulease login --server {url}` to check its "
        "fingerprint and pin it"
    )
