"""First contact with an https server: show its certificate's fingerprint and pin it, as SSH
does with a host key. `login` and `register` call this before they send a password."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.markup import escape

from gpulease.cli.output import console, note
from gpulease.client import ClientError
from gpulease.client.config import TrustedCertificate, pin_certificate, trusted_certificate
from gpulease.client.trust import FINGERPRINT_ENV, fetch_certificate, normalize_fingerprint

YesOption = Annotated[
    bool,
    typer.Option(
        "--yes",
        "-y",
        help="trust the server's self-signed certificate without asking (scripts; "
        f"safer: set {FINGERPRINT_ENV} to the fingerprint you expect)",
    ),
]
ReplaceOption = Annotated[
    bool,
    typer.Option(
        "--replace-certificate",
        help="the operator replaced the server's certificate: check and pin the new one",
    ),
]


def confirm_server_certificate(url: str, *, yes: bool = False, replace: bool = False) -> None:
    """Make sure the next connection to url will be trusted, or refuse with ClientError.

    http URLs and certificates signed by a trusted authority need nothing. A self-signed
    certificate is pinned once its fingerprint is confirmed: it equals GPULEASE_TRUST_-
    FINGERPRINT when that is set, or --yes was given, or the user says yes at the prompt.
    A certificate already pinned stays unless replace is set.
    """
    if not url.startswith("https://"):
        return
    pinned = trusted_certificate(url)
    if pinned is not None and not replace:
        return
    presented = fetch_certificate(url)
    if presented.ca_verified:
        if pinned is not None:
            pin_certificate(url, None)  # an authority vouches for it now; no pin needed
        return
    if pinned is not None and pinned.fingerprint == presented.fingerprint:
        return
    out = console()
    out.print(
        f"The server {escape(url)} shows a certificate that no authority this computer "
        "trusts has signed (a self-signed one).",
        soft_wrap=True,
    )
    out.print(f"SHA-256 fingerprint: [bold]{presented.fingerprint}[/bold]", soft_wrap=True)
    expected = os.environ.get(FINGERPRINT_ENV)
    if expected:
        if normalize_fingerprint(expected) != presented.fingerprint:
            raise ClientError(
                f"the server's certificate fingerprint {presented.fingerprint} is not the "
                f"{FINGERPRINT_ENV} you set ({expected.strip()}); not trusting it"
            )
    elif not yes:
        if not sys.stdin.isatty():
            raise ClientError(
                "cannot ask whether to trust this certificate (no terminal); compare the "
                "fingerprint with the one `gpulease server` printed, then pass --yes or set "
                f"{FINGERPRINT_ENV}=<fingerprint>"
            )
        if not typer.confirm(
            "Compare it with the fingerprint `gpulease server` printed at start. Trust it?",
            default=False,
        ):
            raise ClientError("not trusting the server's certificate; nothing was sent")
    path = pin_certificate(url, TrustedCertificate(presented.fingerprint, presented.pem))
    note(f"certificate of {url} pinned in {path}")
