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
