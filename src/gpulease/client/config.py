"""The saved login: server URL and token in a 0600 JSON file, overridable from the environment."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from gpulease.client.errors import ClientError
from gpulease.client.trust import address

CONFIG_ENV = "GPULEASE_CONFIG"
SERVER_ENV = "GPULEASE_SERVER"
TOKEN_ENV = "GPULEASE_TOKEN"
PINS_KEY = "trusted_certificates"


class Login(NamedTuple):
    """Where to talk to and as whom. `user` is the account name, kept for display only."""

    server: str | None = None
    token: str | None = None
    user: str | None = None


def config_path() -> Path:
    """`$GPULEASE_CONFIG`, else ~/.config/gpulease/config.json."""
    override = os.environ.get(CONFIG_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".config" / "gpulease" / "config.json"


def normalize_server_url(url: str) -> str:
    """'localhost:8420/' -> 'http://localhost:8420'; refuses what cannot be a server URL."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    text = text.rstrip("/")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ClientError(
            f"{url!r} is not a server URL; write it like http://gpu-box:8420 or https://host"
        )
    return text


def load_saved(path: Path | None = None) -> Login:
    """The saved login alone (no environment); an empty Login when nothing is saved."""
    path = path or config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Login()
    except OSError as exc:
        raise ClientError(f"cannot read the config file {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ClientError(
            f"the config file {path} is not valid JSON ({exc.msg}); "
            "delete it and log in again with `gpulease login --server URL`"
        ) from exc
    if not isinstance(data, dict):
        raise ClientError(f"the config file {path} must hold a JSON object; delete it and log in")

    def text_field(key: str) -> str | None:
        value = data.get(key)
        return value if isinstance(value, str) and value else None

    return Login(server=text_field("server"), token=text_field("token"), user=text_field("user"))


def resolve_login(path: Path | None = None) -> Login:
    """The saved login with GPULEASE_SERVER / GPULEASE_TOKEN applied on top.

    A saved token is only ever sent to the server it was issued by: pointing
    GPULEASE_SERVER elsewhere without GPULEASE_TOKEN drops it rather than leak it.
    """
    saved = load_saved(path)
    server, token, user = saved.server, saved.token, saved.user
    env_server = os.environ.get(SERVER_ENV)
    if env_server:
        env_server = normalize_server_url(env_server)
        if env_server != server:
            token, user = None, None
        server = env_server
    env_token = os.environ.get(TOKEN_ENV)
    if env_token:
        token, user = env_token, None
    return Login(server=server, token=token, user=user)


def save_login(login: Login, path: Path | None = None) -> Path:
    """Write the login atomically, readable by its owner only (0600, in a 0700 directory).
    Pinned server certificates in the file are kept."""
    path = path or config_path()
    data: dict[str, object] = {k: v for k, v in login._asdict().items() if v is not None}
    try:
        pins = _read_object(path).get(PINS_KEY)
    except ClientError:
        pins = None  # an unreadable file is replaced, as before pins existed
    if isinstance(pins, dict) and pins:
        data[PINS_KEY] = pins
    return _write_object(data, path)


class TrustedCertificate(NamedTuple):
    """A server certificate the user confirmed (by its fingerprint) at the first login."""

    fingerprint: str
    pem: str


def trusted_certificate(server_url: str, path: Path | None = None) -> TrustedCertificate | None:
    """The certificate pinned for an https server (by host:port); None when none is."""
    if not server_url.startswith("https://"):
        return None
    pins = _read_object(path or config_path()).get(PINS_KEY)
    entry = pins.get(address(server_url)) if isinstance(pins, dict) else None
    if not isinstance(entry, dict):
        return None
    fingerprint, pem = entry.get("fingerprint"), entry.get("certificate")
    if not isinstance(fingerprint, str) or not isinstance(pem, str):
        return None
    return TrustedCertificate(fingerprint=fingerprint, pem=pem)


def pin_certificate(
    server_url: str, pinned: TrustedCertificate | None, path: Path | None = None
) -> Path:
    """Pin (or with None forget) the certificate trusted for an https server."""
    path = path or config_path()
    data = _read_object(path)
    pins = data.get(PINS_KEY)
    pins = dict(pins) if isinstance(pins, dict) else {}
    if pinned is None:
        pins.pop(address(server_url), None)
    else:
        pins[address(server_url)] = {"fingerprint": pinned.fingerprint, "certificate": pinned.pem}
    data[PINS_KEY] = pins
    return _write_object(data, path)


def _read_object(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as exc:
        raise ClientError(
            f"cannot read the config file {path} ({exc}); delete it and log in again"
        ) from exc
    return data if isinstance(data, dict) else {}


def _write_object(data: dict[str, object], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=2)
            out.write("\n")
        os.chmod(partial, 0o600)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise
    return path


def forget_token(path: Path | None = None) -> Login:
    """Drop the saved token (keep the server URL); returns what was saved before."""
    path = path or config_path()
    saved = load_saved(path)
    if saved.token is not None or saved.user is not None:
        save_login(Login(server=saved.server), path)
    return saved
