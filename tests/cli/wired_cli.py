"""`Cli`: runs `gpulease` commands in process against the in-process server (see conftest)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inprocess import SERVER_URL, InProcessServer
from typer.testing import CliRunner, Result

from gpulease.cli.main import app
from gpulease.client import GpuleaseClient, Login, save_login


@dataclass
class Cli:
    server: InProcessServer
    config: Path

    def __call__(self, *args: str, input: str | None = None) -> Result:
        result = CliRunner().invoke(app, list(args), input=input)
        assert "Traceback" not in result.output, result.output
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result

    def login_as(self, name: str = "ann") -> GpuleaseClient:
        """Register `name` and save its login, as `gpulease register` would."""
        client = self.server.user(name)
        assert client.token is not None
        save_login(Login(server=SERVER_URL, token=client.token, user=name))
        return client

    def login_as_admin(self) -> GpuleaseClient:
        client = self.server.admin()
        assert client.token is not None
        save_login(Login(server=SERVER_URL, token=client.token, user="admin"))
        return client
