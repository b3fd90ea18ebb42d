"""The saved login: server URL and token in a 0600 JSON file, overridable from the environment."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpulease.client.errors import ClientError

CONFIG_ENV = "GPULEASE_CONFIG"
SERVER_ENV = "GPULEASE_SERVER"
TOKEN_ENV = "GPULEASE_TOKEN"


@dataclass(frozen=True)
class Login:
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
    """Write the login atomically, readable by its owner only (0600, in a 0700 directory)."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = {k: v for k, v in vars(login).items() if v is not None}
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
