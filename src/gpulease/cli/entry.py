"""The `gpulease` program: `gpulease exec REF -- COMMAND` on a running instance takes a quick
path that imports only the standard library's HTTP client (client/quickexec.py); every other
command, and any exec this path does not finish, is the Typer app of cli/main.py.

The quick path takes exactly `exec REF [--env KEY=VALUE | -e KEY=VALUE]... -- COMMAND...`;
anything else (`--help`, another option, no `--`, a malformed --env) goes to the Typer app,
which says what is wrong. It prints what the Typer command prints (the run's note on
stderr, the job's bytes as they are, `error: ...` on refusals) and exits with the same code.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class ExecRequest:
    ref: str
    command: list[str]
    env: dict[str, str]


def exec_request(argv: list[str]) -> ExecRequest | None:
    """The exec that argv asks for, when it has the quick path's one form; None otherwise."""
    if len(argv) < 4 or argv[0] != "exec" or argv[1].startswith("-") or "--" not in argv:
        return None
    split = argv.index("--")
    options, command = argv[2:split], argv[split + 1 :]
    env: dict[str, str] = {}
    index = 0
    while index < len(options):
        option = options[index]
        if option.startswith("--env="):
            item = option.removeprefix("--env=")
        elif option in ("--env", "-e") and index + 1 < len(options):
            index += 1
            item = options[index]
        else:
            return None
        key, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(key):
            return None
        env[key] = value
        index += 1
    return ExecRequest(argv[1], command, env) if command else None


def quick_exec(request: ExecRequest) -> int | None:
    """Run the exec on the quick path; its exit code, or None when it left it to the Typer
    app before sending anything (no saved login, a proxy)."""
    import json

    from gpulease.client import quickexec
    from gpulease.client.config import resolve_login, trusted_certificate
    from gpulease.client.errors import ClientError
    from gpulease.core.run_commands import command_text, shell_exit_code

    login = resolve_login()
    if login.server is None or login.token is None:
        return None
    body = {"command": command_text(request.command), "env": request.env}
    try:
        started = quickexec.open_exec(
            login.server, login.token, trusted_certificate(login.server), request.ref, body
        )
    except quickexec.Declined:
        return None
    except ClientError as exc:
        sys.stderr.write(f"error: {exc.message}\n")
        return 1
    run_id = started.run_id
    sys.stderr.write(f"run {run_id} on instance {request.ref}\n")
    after = -1
    try:
        if started.started["instance_status"] == "running":
            for message in started.messages:
                if message.event == "log":
                    chunk = json.loads(message.data)
                    if int(chunk["seq"]) > after:
                        _write(chunk)
                        after = int(chunk["seq"])
                elif message.event == "end":
                    end = json.loads(message.data)
                    code = shell_exit_code(end.get("exit_code"), str(end.get("status")))
                    if code is not None:
                        return code
                    break  # the SDK's path says why it failed
    except KeyboardInterrupt:
        sys.stderr.write(
            f"run {run_id} keeps running; follow it with `gpulease logs {run_id} -f`\n"
        )
        return EXIT_INTERRUPTED
    return _resume(request.ref, started.started_json, after)


def _write(chunk: dict[str, Any]) -> None:
    """The job's bytes as they are, on the stream it used (as cli/runs.write_chunk)."""
    stream = sys.stderr if chunk.get("stream") == "stderr" else sys.stdout
    stream.write(str(chunk["data"]))
    stream.flush()


def _resume(ref: str, started_json: str, after: int) -> int:
    """The rest of the exec through the SDK, from its run's stream after chunk `after`."""
    from gpulease.cli.main import reported
    from gpulease.cli.runs import resume_exec

    return reported(lambda: resume_exec(ref, started_json, after))


def main() -> None:
    """The console script."""
    request = exec_request(sys.argv[1:])
    if request is not None:
        code = quick_exec(request)
        if code is not None:
            sys.exit(code)
    from gpulease.cli.main import app

    app()
