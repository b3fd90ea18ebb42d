"""CLI accounts: register, login, logout, whoami, tokens; and what happens without a login."""

from __future__ import annotations

import json
import stat

import pytest
from inprocess import SERVER_URL
from wired_cli import Cli

from gpulease.cli import connection
from gpulease.client import ApiError, GpuleaseClient, load_saved


def test_register_prompts_saves_the_login_privately_and_whoami_uses_it(cli: Cli) -> None:
    result = cli("register", "--server", SERVER_URL, input="cara\ncara-pw-1\ncara-pw-1\n")
    assert result.exit_code == 0, result.output
    assert "registered cara" in result.stdout
    assert "cara-pw-1" not in result.output  # the password is never echoed
    saved = load_saved(cli.config)
    assert (saved.server, saved.user) == (SERVER_URL, "cara")
    assert saved.token is not None and saved.token.startswith("glp_")
    assert stat.S_IMODE(cli.config.stat().st_mode) == 0o600

    whoami = cli("whoami")
    assert whoami.exit_code == 0 and "cara" in whoami.stdout and SERVER_URL in whoami.stdout
    as_json = json.loads(cli("whoami", "-o", "json").stdout)
    assert (as_json["name"], as_json["role"], as_json["server"]) == ("cara", "user", SERVER_URL)


def test_login_with_options_then_logout_revokes_the_token(cli: Cli) -> None:
    result = cli("login", "--server", SERVER_URL, "--name", "ann", "--password", "ann-password-1")
    assert result.exit_code == 0, result.output
    token = load_saved(cli.config).token
    assert token is not None

    assert cli("logout").exit_code == 0
    saved = load_saved(cli.config)
    assert (saved.server, saved.token) == (SERVER_URL, None)
    with pytest.raises(ApiError, match="revoked"):
        cli.server.client(token).auth.me()
    assert "not logged in" in cli("whoami").stderr


def test_wrong_password_is_an_error_line_not_a_traceback(cli: Cli) -> None:
    result = cli("login", "--server", SERVER_URL, "--name", "ann", "--password", "nope")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert load_saved(cli.config).token is None


def test_commands_without_a_login_say_how_to_log_in(cli: Cli) -> None:
    for args in (["whoami"], ["gpus"], ["instance", "ls"], ["balance"]):
        result = cli(*args)
        assert result.exit_code == 1
        assert "gpulease login --server URL" in result.stderr
    result = cli("login", "--name", "ann", "--password", "x")
    assert result.exit_code == 2
    assert "--server" in result.stderr


def test_unreachable_server_is_named(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        connection, "open_client", lambda url, token: GpuleaseClient(url, token, timeout=5)
    )
    result = cli("login", "--server", "http://127.0.0.1:9", "--name", "a", "--password", "b")
    assert result.exit_code == 1
    assert "cannot reach the gpulease server at http://127.0.0.1:9" in result.stderr


def test_tokens_create_list_revoke(cli: Cli) -> None:
    ann = cli.login_as("ann")
    created = cli("token", "create", "laptop")
    assert created.exit_code == 0
    secret = created.stdout.strip()
    assert secret.startswith("glp_") and "not shown again" in created.stderr
    assert cli.server.client(secret).auth.me().name == "ann"

    listed = json.loads(cli("token", "ls", "-o", "json").stdout)
    laptop = next(t for t in listed if t["name"] == "laptop")
    assert "laptop" in cli("token", "ls").stdout
    assert cli("token", "revoke", str(laptop["id"])).exit_code == 0
    assert [t.revoked_at is not None for t in ann.tokens.list() if t.name == "laptop"] == [True]
    missing = cli("token", "revoke", "999")
    assert missing.exit_code == 1 and "no token with id 999" in missing.stderr


def test_register_without_a_terminal_says_which_option_is_missing(cli: Cli) -> None:
    nameless = cli("register", "--server", SERVER_URL)
    assert nameless.exit_code == 2
    assert "give --name NAME" in nameless.stderr and "Aborted" not in nameless.output
    passwordless = cli("register", "--server", SERVER_URL, "--name", "cara")
    assert passwordless.exit_code == 2 and "give --password PASSWORD" in passwordless.stderr
    assert load_saved(cli.config).token is None


def test_token_revoke_by_name(cli: Cli) -> None:
    ann = cli.login_as("ann")
    for name in ("laptop", "ci", "ci"):
        assert cli("token", "create", name).exit_code == 0
    revoked = cli("token", "revoke", "laptop")
    assert revoked.exit_code == 0, revoked.output
    (laptop,) = [t for t in ann.tokens.list() if t.name == "laptop"]
    assert laptop.revoked_at is not None and f"token {laptop.id} revoked" in revoked.stdout
    twice = cli("token", "revoke", "ci")
    ci_ids = sorted(t.id for t in ann.tokens.list() if t.name == "ci")
    assert twice.exit_code == 2 and f"ids {ci_ids[0]}, {ci_ids[1]}" in twice.stderr
    assert all(t.revoked_at is None for t in ann.tokens.list() if t.name == "ci")
    again = cli("token", "revoke", "laptop")
    assert again.exit_code == 1 and "no live token named 'laptop'" in again.stderr
