"""The saved login: file location and mode, environment overrides, and broken files."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gpulease.client import ClientError, GpuleaseClient, Login, NotLoggedIn
from gpulease.client.config import (
    forget_token,
    load_saved,
    normalize_server_url,
    resolve_login,
    save_login,
)


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "conf" / "config.json"
    monkeypatch.setenv("GPULEASE_CONFIG", str(path))
    monkeypatch.delenv("GPULEASE_SERVER", raising=False)
    monkeypatch.delenv("GPULEASE_TOKEN", raising=False)
    return path


def test_saved_login_is_private_and_round_trips(config: Path) -> None:
    assert load_saved() == Login()
    save_login(Login(server="http://a:8420", token="glp_x", user="ann"))
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert resolve_login() == Login(server="http://a:8420", token="glp_x", user="ann")
    assert forget_token() == Login(server="http://a:8420", token="glp_x", user="ann")
    assert load_saved() == Login(server="http://a:8420")
    assert stat.S_IMODE(config.stat().st_mode) == 0o600


def test_default_location_is_under_the_home_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPULEASE_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    save_login(Login(server="http://a:8420"))
    assert (tmp_path / ".config" / "gpulease" / "config.json").exists()


def test_environment_overrides_and_never_sends_a_token_elsewhere(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_login(Login(server="http://a:8420", token="glp_saved", user="ann"))
    monkeypatch.setenv("GPULEASE_SERVER", "http://a:8420/")
    assert resolve_login().token == "glp_saved"
    monkeypatch.setenv("GPULEASE_SERVER", "b:8420")
    assert resolve_login() == Login(server="http://b:8420")
    monkeypatch.setenv("GPULEASE_TOKEN", "glp_env")
    assert resolve_login() == Login(server="http://b:8420", token="glp_env")


def test_client_from_saved_login(config: Path) -> None:
    with pytest.raises(NotLoggedIn, match="gpulease login --server URL"):
        GpuleaseClient.from_saved_login()
    save_login(Login(server="http://a:8420", token="glp_x"))
    with GpuleaseClient.from_saved_login() as client:
        assert (client.server_url, client.token) == ("http://a:8420", "glp_x")


def test_a_broken_config_file_says_what_to_do(config: Path) -> None:
    config.parent.mkdir(parents=True)
    config.write_text("{not json")
    with pytest.raises(ClientError, match="not valid JSON.*log in again"):
        resolve_login()
    config.write_text("[]")
    with pytest.raises(ClientError, match="JSON object"):
        resolve_login()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("localhost:8420", "http://localhost:8420"),
        ("https://gpus.example.org/", "https://gpus.example.org"),
        ("  http://10.0.0.5:8420  ", "http://10.0.0.5:8420"),
    ],
)
def test_server_urls_are_normalized(given: str, expected: str) -> None:
    assert normalize_server_url(given) == expected


@pytest.mark.parametrize("bad", ["ftp://host", "http://", ""])
def test_bad_server_urls_are_refused(bad: str) -> None:
    with pytest.raises(ClientError, match="not a server URL"):
        normalize_server_url(bad)
