"""How commands get a GpuleaseClient: the saved login, or the server named on the command line.

`open_client` is the one seam for tests: they replace it (monkeypatch) with a function that
builds the client on a Starlette TestClient, so every command runs against the ASGI app in
process. Nothing else in the CLI constructs a GpuleaseClient, and commands call it as
`connection.open_client` (never imported by name) so that the replacement is the one used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from gpulease.client import GpuleaseClient, Login, resolve_login
from gpulease.client.config import trusted_certificate
from gpulease.client.errors import NotLoggedIn

T = TypeVar("T")

LOGIN_HINT = "run `gpulease login --server URL` (or `gpulease register --server URL`) first"


def open_client(server_url: str, token: str | None) -> GpuleaseClient:
    """Build the client for server_url (token None: anonymous), trusting the certificate
    pinned for it if there is one. Tests replace this."""
    return GpuleaseClient(server_url, token, trusted=trusted_certificate(server_url))


def current_login() -> Login:
    return resolve_login()


def logged_in_client() -> GpuleaseClient:
    """A client for the saved login; NotLoggedIn (with what to run) when there is none."""
    login = current_login()
    if login.server is None or login.token is None:
        raise NotLoggedIn(f"not logged in: {LOGIN_HINT}")
    return open_client(login.server, login.token)


def fetch(call: Callable[[GpuleaseClient], T]) -> T:
    """`call(client)` on a client for the saved login, closed again before it returns."""
    with logged_in_client() as client:
        return call(client)


def server_url_or_saved(server: str | None) -> str:
    """The --server given, else GPULEASE_SERVER or the saved one."""
    if server:
        return server
    saved = current_login().server
    if saved is None:
        raise NotLoggedIn("which server? pass --server URL, e.g. --server http://gpu-box:8420")
    return saved
