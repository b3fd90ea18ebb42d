"""Importing the CLI stays light: no database, no web framework, no server modules."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

SERVER_SIDE = ("sqlalchemy", "alembic", "fastapi", "starlette", "uvicorn", "gpulease.server")


def test_importing_the_cli_loads_nothing_of_the_server() -> None:
    code = "import json, sys\nimport gpulease.cli.main\nprint(json.dumps(sorted(sys.modules)))\n"
    answer = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = json.loads(answer.stdout)
    heavy = [
        name
        for name in loaded
        if any(name == top or name.startswith(top + ".") for top in SERVER_SIDE)
    ]
    assert heavy == []


def test_gpulease_help_works_in_a_fresh_process() -> None:
    """The installed entry point (beside this interpreter), as people run it."""
    command = shutil.which("gpulease", path=str(Path(sys.executable).parent))
    run_app = "from gpulease.cli.main import app; app()"
    argv = [command, "--help"] if command else [sys.executable, "-c", run_app, "--help"]
    answer = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert answer.returncode == 0, answer.stderr
    assert "Usage" in answer.stdout and "instance" in answer.stdout and "server" in answer.stdout


def loaded_modules(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running code."""
    program = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))\n"
    answer = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    return list(json.loads(answer.stdout.splitlines()[-1]))


def under(loaded: list[str], tops: tuple[str, ...]) -> list[str]:
    return [name for name in loaded if any(name == t or name.startswith(t + ".") for t in tops)]


def test_gpulease_help_imports_no_command_module_and_no_http_stack() -> None:
    code = (
        "import contextlib, io, sys\nsys.argv = ['gpulease', '--help']\n"
        "from gpulease.cli.entry import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    main()"
    )
    loaded = loaded_modules(code)
    commands = [m for m in under(loaded, ("gpulease.cli",)) if m != "gpulease.cli"]
    assert sorted(commands) == ["gpulease.cli.entry", "gpulease.cli.main"]
    assert under(loaded, ("httpx", "pydantic", "rich", "gpulease.client")) == []


def test_the_quick_exec_path_imports_no_http_library_models_or_typer() -> None:
    loaded = loaded_modules("import gpulease.cli.entry, gpulease.client.quickexec")
    assert under(loaded, ("httpx", "pydantic", "typer", "rich", "click", *SERVER_SIDE)) == []
    assert under(loaded, ("gpulease.schemas", "gpulease.client.api")) == []
    # Nor the standard library's slower parts: http.client (with the email package),
    # dataclasses (with inspect), and for an http server ssl and hashlib, which together
    # took longer to import than the exec took to answer.
    slow = ("http", "email", "dataclasses", "inspect", "ssl", "_ssl", "hashlib")
    assert under(loaded, slow) == []


def test_an_https_quick_exec_loads_ssl_only_to_wrap_its_socket() -> None:
    code = (
        "import socket, threading\nfrom gpulease.client import quickexec\n"
        "listener = socket.create_server(('127.0.0.1', 0))\n"
        "threading.Thread(target=lambda: listener.accept()[0].close(), daemon=True).start()\n"
        "url = f'https://127.0.0.1:{listener.getsockname()[1]}'\n"
        "try:\n"
        "    quickexec.call_json(url, 't', None, 'GET', '/me')\n"
        "except quickexec.ClientError as exc:\n"
        "    print(type(exc).__name__, file=sys.stderr)"
    )
    loaded = loaded_modules(code)
    assert "ssl" in loaded and under(loaded, ("http", "email", "dataclasses")) == []


def test_each_command_listed_by_help_has_that_help() -> None:
    """COMMANDS keeps each command's text so that `gpulease --help` imports nothing; it
    must be the first paragraph of the command's own help."""
    import inspect

    from gpulease.cli.main import COMMANDS, click_command

    for name, lazy in COMMANDS.items():
        command = click_command(name, lazy.load())
        first = inspect.cleandoc(command.help or "").split("\n\n")[0].replace("\n", " ")
        assert lazy.help == first, name


def test_a_command_loads_the_client_group_it_uses_and_not_the_others() -> None:
    """`gpulease dataset ls` loads the client's datasets group and its wire models, not
    every group's (building the models of all of them cost each command about 0.15 s),
    nor YAML (read only for pricing and task files)."""
    code = (
        "import contextlib, io, os, sys\nsys.argv = ['gpulease', 'dataset', 'ls']\n"
        "os.environ.update(GPULEASE_SERVER='http://127.0.0.1:9', GPULEASE_TOKEN='t')\n"
        "from gpulease.cli.entry import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()), "
        "contextlib.redirect_stderr(io.StringIO()) as err:\n"
        "    main()\n"
        "assert 'cannot reach the gpulease server' in err.getvalue(), err.getvalue()"
    )
    loaded = loaded_modules(code)
    assert "gpulease.client.datasets" in loaded and "gpulease.client.api" in loaded
    others = ("instances", "runs", "billing", "admin", "sweeps", "statements", "support")
    assert under(loaded, tuple(f"gpulease.client.{group}" for group in others)) == []
    assert under(loaded, ("gpulease.schemas.instances", "gpulease.schemas.runs", "yaml")) == []


def test_the_quick_push_path_imports_no_http_library_models_or_typer() -> None:
    """What cli/entry.quick_push imports: an unchanged re-push is the scan and one request,
    without httpx, pydantic, Typer or rich (about 0.4 s of imports here)."""
    modules = (
        "gpulease.cli.entry",
        "gpulease.cli.push_words",
        "gpulease.client.config",
        "gpulease.client.push_index",
        "gpulease.client.quickexec",
        "gpulease.client.scan",
        "gpulease.core.datasets",
    )
    loaded = loaded_modules("import " + ", ".join(modules))
    assert under(loaded, ("httpx", "pydantic", "typer", "rich", "click", *SERVER_SIDE)) == []
    assert under(loaded, ("gpulease.schemas", "gpulease.client.api", "yaml")) == []
