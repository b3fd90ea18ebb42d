"""Account commands: register, login, logout, whoami, and API tokens."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from gpulease.cli import connection
from gpulease.cli import output as out
from gpulease.cli.connection import fetch, logged_in_client, server_url_or_saved
from gpulease.cli.trust import ReplaceOption, YesOption, confirm_server_certificate
from gpulease.client import ClientError, GpuleaseClient, Login, config_path, save_login
from gpulease.client.config import TOKEN_ENV, forget_token, normalize_server_url
from gpulease.schemas.accounts import (
    AuthResult,
    LoginRequest,
    RegisterRequest,
    TokenCreate,
    TokenCreated,
)


def _server_url(value: str | None) -> str:
    # Eager, so a missing server is reported before the name and password prompts.
    try:
        return normalize_server_url(server_url_or_saved(value))
    except ClientError as exc:
        raise typer.BadParameter(exc.message) from exc


ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="server URL, e.g. http://gpu-box:8420 (default: the saved one)",
        is_eager=True,
        callback=_server_url,
    ),
]
NameOption = Annotated[str, typer.Option("--name", prompt="Name", help="your account name")]


def _asked(value: str | None, prompt: str, option: str, *, secret: bool = False) -> str:
    """`value`, else what the user types at the prompt; with nothing to read the prompt
    from (no terminal, no piped input), exits 2 naming the option to give instead."""
    if value is not None:
        return value
    try:
        answer: str = typer.prompt(prompt, hide_input=secret, confirmation_prompt=secret)
    except typer.Abort:
        if sys.stdin.isatty():
            raise
        out.fail(f"no {prompt.lower()} to register with: give {option} (no terminal to ask on)", 2)
    return answer


def register(
    name: Annotated[
        str | None, typer.Option("--name", help="your account name; asked when left out")
    ] = None,
    password: Annotated[
        str | None,
        typer.Option("--password", help="asked for (hidden, twice) when left out"),
    ] = None,
    server: ServerOption = None,
    email: Annotated[str | None, typer.Option("--email")] = None,
    yes: YesOption = False,
    replace_certificate: ReplaceOption = False,
) -> None:
    """Create an account on a server and stay logged in to it."""
    url = _server_url(server)
    name = _asked(name, "Name", "--name NAME")
    password = _asked(password, "Password", "--password PASSWORD", secret=True)
    body = RegisterRequest(name=name, password=password, email=email)
    user, path = _sign_in(url, yes, replace_certificate, lambda client: client.auth.register(body))
    out.console().print(f"registered [bold]{user}[/bold] on {url}; logged in")
    out.note(f"login saved in {path}")


def login(
    name: NameOption,
    password: Annotated[
        str,
        typer.Option(
            "--password", prompt="Password", hide_input=True, help="prompted when left out"
        ),
    ],
    server: ServerOption = None,
    yes: YesOption = False,
    replace_certificate: ReplaceOption = False,
) -> None:
    """Log in to a server; the token is saved for the next commands."""
    url = _server_url(server)
    token_name = f"cli on {platform.node() or 'host'}"
    body = LoginRequest(name=name, password=password, token_name=token_name)
    user, path = _sign_in(url, yes, replace_certificate, lambda client: client.auth.login(body))
    out.console().print(f"logged in to {url} as [bold]{user}[/bold]")
    out.note(f"login saved in {path}")


def _sign_in(
    url: str, yes: bool, replace_certificate: bool, call: Callable[[GpuleaseClient], AuthResult]
) -> tuple[str, Path]:
    """Trust url's certificate (asking first), `call` it anonymously and save the login it
    returns: the user's name and where the login is saved."""
    confirm_server_certificate(url, yes=yes, replace=replace_certificate)
    with connection.open_client(url, None) as client:
        result = call(client)
    path = save_login(Login(server=url, token=result.token, user=result.user.name))
    return result.user.name, path


def logout() -> None:
    """Revoke the saved token on the server and forget it here (the server URL stays)."""
    saved = forget_token()
    if saved.token is None:
        out.note("not logged in")
    elif saved.server is not None:
        try:
            with connection.open_client(saved.server, saved.token) as client:
                prefix = saved.token[:10]
                for token in client.tokens.list():
                    if token.prefix == prefix and token.revoked_at is None:
                        client.tokens.revoke(token.id)
        except ClientError as exc:
            out.note(f"the token was forgotten here but not revoked on the server: {exc.message}")
        out.console().print(f"logged out of {saved.server}")
    if os.environ.get(TOKEN_ENV):
        out.note(f"{TOKEN_ENV} is still set in your environment; unset it too")


def whoami(output: out.OutputOption = out.OutputFormat.table) -> None:
    """Who the saved login is, on which server."""
    with logged_in_client() as client:
        user = client.auth.me()
    found = {**user.model_dump(mode="json"), "server": client.server_url}
    fields = [
        ("user", user.name),
        ("role", user.role),
        ("server", client.server_url),
        ("since", out.when(user.created_at)),
        ("config", config_path()),
    ]
    out.emit(found, output, lambda _: out.show_fields(fields))


token_app = typer.Typer(help="API tokens for scripts and other machines.", no_args_is_help=True)


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Argument(help="what the token is for, e.g. 'laptop'")],
    output: out.OutputOption = out.OutputFormat.table,
) -> None:
    """Create an API token; its secret is shown this once only."""
    out.emit(
        fetch(lambda client: client.tokens.create(TokenCreate(name=name))), output, _show_created
    )


def _show_created(created: TokenCreated) -> None:
    typer.echo(created.token)
    out.note(f"token {created.info.id} ({created.info.name}): copy it now, it is not shown again")


@token_app.command("ls")
def token_list(output: out.OutputOption = out.OutputFormat.table) -> None:
    """Your API tokens (secrets are never shown again, only their first characters)."""
    out.emit_rows(
        fetch(lambda client: client.tokens.list()),
        output,
        ("ID", "NAME", "PREFIX", "CREATED", "LAST USED", "REVOKED"),
        lambda t: (
            t.id,
            t.name,
            t.prefix + "…",
            out.when(t.created_at),
            out.when(t.last_used_at),
            out.when(t.revoked_at),
        ),
        empty="no tokens",
    )


@token_app.command("revoke")
def token_revoke(
    token: Annotated[str, typer.Argument(metavar="TOKEN", help="its id or its name")],
) -> None:
    """Revoke a token: requests with it are refused from now on."""
    with logged_in_client() as client:
        token_id = int(token) if token.isdigit() else _token_named(client, token)
        client.tokens.revoke(token_id)
    out.console().print(f"token {token_id} revoked", markup=False)


def _token_named(client: GpuleaseClient, name: str) -> int:
    """The id of your one live token called `name`; exits saying why when there is none
    or several."""
    ids = [t.id for t in client.tokens.list() if t.name == name and t.revoked_at is None]
    if not ids:
        out.fail(f"you have no live token named {name!r}; `gpulease token ls` lists them", 1)
    if len(ids) > 1:
        listed = ", ".join(map(str, ids))
        out.fail(f"{len(ids)} of your tokens are named {name!r} (ids {listed}): give the id", 2)
    return ids[0]
