"""A run's own command as people read it: the task's `run`, not the script that wraps it.

TaskSpec.script() wraps a task file's setup and run (SkyPilot's setup-then-run wrapper, or
`set -e` setup before the run); the server stores that script as the run's command. The CLI,
the console and notifications show what the task itself says to run.
"""

from __future__ import annotations

import shlex

_EXEC_RUN = "exec bash -c "


def own_command(script: str) -> str:
    """The task's own `run` command in a script TaskSpec.script() wrapped it in (SkyPilot's
    setup-then-run wrapper, or `set -e` setup before the run); any other script as is."""
    if script.endswith(" run"):
        start = script.find(_EXEC_RUN)
        while start != -1:
            quoted = script[start + len(_EXEC_RUN) : -len(" run")]
            try:
                (command,) = shlex.split(quoted)
            except ValueError:
                command = None
            if command is not None and shlex.quote(command) == quoted:
                return command
            start = script.find(_EXEC_RUN, start + 1)
    if script.startswith("set -e\n") and "\nset +e\n" in script:
        return script.split("\nset +e\n", 1)[1]
    return script


def first_line(command: str | None, width: int = 60) -> str:
    """A command for one line of a table or a note: its first line, cut at `width`, with
    '…' where something was left out."""
    lines = (command or "").strip().splitlines() or [""]
    return lines[0][:width] + ("…" if len(lines) > 1 or len(lines[0]) > width else "")


def command_text(args: list[str]) -> str:
    """A command line as the run's bash script: one argument is a shell script as is
    (`-- 'a && b'`); several are quoted and joined."""
    return args[0] if len(args) == 1 else shlex.join(args)


def shell_exit_code(exit_code: int | None, status: str) -> int | None:
    """A run's end as the shell sees it: its exit code, 128+N for signal N (the protocol's
    -N), 1 for a code past 255; 0 for a run that succeeded without one; None when it ended
    otherwise without one (its instance stopped, say), for the caller to explain."""
    if exit_code is not None:
        if exit_code < 0:
            return 128 + min(-exit_code, 127)
        return exit_code if exit_code <= 255 else 1
    return 0 if status == "succeeded" else None
