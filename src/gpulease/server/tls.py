"""HTTPS for the server: the operator's certificate, or a self-signed one made at first start."""

from __future__ import annotations

import ipaddress
import os
import platform
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpulease.client.trust import certificate_fingerprint
from gpulease.core.errors import GpuleaseError
from gpulease.server.settings import Settings

CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"
SELF_SIGNED_DAYS = 3650


class TlsError(GpuleaseError):
    """The certificate or key cannot be used; the message names the file and the fix."""


@dataclass(frozen=True)
class TlsFiles:
    """What uvicorn serves with, and what people compare at the first login."""

    cert: Path
    key: Path
    self_signed: bool
    fingerprint: str  # SHA-256 of the (leaf) certificate, AB:CD:…


def certificate_names(settings: Settings) -> list[str]:
    """Host names and addresses a self-signed certificate is made for: localhost, the
    loopback addresses, this host's name, the listening host and the public URL's host."""
    names = ["localhost", "127.0.0.1", "::1"]
    node = platform.node()
    for candidate in (node, settings.host, urlsplit(settings.public_url or "").hostname):
        if candidate and candidate not in {"0.0.0.0", "::"} and candidate not in names:
            names.append(candidate)
    return names


def generate_self_signed(cert_path: Path, key_path: Path, names: list[str]) -> None:
    """An ECDSA P-256 key (0600) and a ten-year self-signed server certificate for names."""
    key = ec.generate_private_key(ec.SECP256R1())
    alternative: list[x509.GeneralName] = []
    for name in names:
        try:
            alternative.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternative.append(x509.DNSName(name))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpulease {names[-1]}")])
    now = datetime.now(UTC)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(alternative), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key_bytes)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def prepare_tls(settings: Settings) -> TlsFiles | None:
    """The certificate and key to serve with (None: plain HTTP). Makes the self-signed pair
    on first use and checks that the files load and belong together."""
    if not settings.tls_enabled:
        return None
    if settings.tls_self_signed:
        cert, key = settings.tls_path / CERT_FILE, settings.tls_path / KEY_FILE
        if not (cert.exists() and key.exists()):
            generate_self_signed(cert, key, certificate_names(settings))
    else:
        assert settings.tls_cert is not None and settings.tls_key is not None
        cert, key = settings.tls_cert, settings.tls_key
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        leaf = x509.load_pem_x509_certificate(cert.read_bytes())
        fingerprint = certificate_fingerprint(leaf.public_bytes(serialization.Encoding.DER))
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise TlsError(
            f"cannot serve HTTPS with certificate {cert} and key {key}: {exc}; they must be "
            "readable PEM files, the key belonging to the certificate (first in the file)"
        ) from exc
    return TlsFiles(
        cert=cert, key=key, self_signed=settings.tls_self_signed, fingerprint=fingerprint
    )


def runner_trust(settings: Settings) -> str | None:
    """The certificate runners trust exactly (the self-signed one, PEM); None: runners
    verify the operator's certificate against the usual authorities."""
    if not settings.tls_self_signed:
        return None
    return (settings.tls_path / CERT_FILE).read_text()
