"""The `gpulease` program: `gpulease exec REF -- COMMAND` on a running instance takes a quick
path that imports only a little of the standard library (client/quickexec.py), and so do
the first two requests of `gpulease run --gpu G -- COMMAND`; every other command, any exec
this path does not finish and the rest of such a run are the Typer app of cli/main.py.

The quick path takes exactly `exec REF [--env KEY=VALUE | -e KEY=VALUE]... -- COMMAND...`
and `run [--gpu G] [--template T] [-e KEY=VALUE]... -- COMMAND...`; anything else
(`--help`, another option, no `--`, a malformed --env, a task file) goes to the Typer app,
which says what is wrong. It prints what the Typer command prints (the run's note on
stderr, the job's bytes as they are, `error: ...` on refusals) and exits with the same code.
A quick run makes its instance and its run and prints the run's output; the Typer app's
`run` (cli/runs.resume_run) says how it ended, what it cost, and anything out of the way.

`dataset push DIR [--name NAME | -n NAME] [--output table|json | -o ...]` of a tree that the
server holds as the dataset's current version already (the push index says so, from the
tree's scan alone) ends on a quick path of its own too, with what the Typer command prints;
any other push, and any error, is the Typer app's from the start.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpulease.client.sse import SseMessage

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EXIT_INTERRUPTED = 130
PLACED_POLL_S = 0.05
PLACED_WAIT_S = 2.0


class ExecRequest(NamedTuple):
    ref: str
    command: list[str]
    env: dict[str, str]


class RunRequest(NamedTuple):
    command: list[str]
    env: dict[str, str]
    gpu: str | None
    template: str | None


class PushRequest(NamedTuple):
    directory: str
    name: str | None
    json: bool


_PUSH_OPTIONS = {"--name": "name", "-n": "name", "--output": "output", "-o": "output"}


def exec_request(argv: list[str]) -> ExecRequest | None:
    """The exec that argv asks for, when it has the quick path's one form; None otherwise."""
    if len(argv) < 4 or argv[0] != "exec" or argv[1].startswith("-") or "--" not in argv:
        return None
    parsed = _parse(argv[2:], ())
    if parsed is None:
        return None
    command, env, _ = parsed
    return ExecRequest(argv[1], command, env)


def run_request(argv: list[str]) -> RunRequest | None:
    """The run that argv asks for when it is `run [--gpu G] [--template T] [-e K=V]... --
    COMMAND...` (a task file, --retry, --workdir and the rest are the Typer app's); None
    otherwise."""
    if len(argv) < 3 or argv[0] != "run":
        return None
    parsed = _parse(argv[1:], ("--gpu", "--template"))
    if parsed is None:
        return None
    command, env, values = parsed
    if len(command) == 1 and command[0].endswith((".yaml", ".yml")):
        return None  # `run -- task.yaml` is the task file's
    return RunRequest(command, env, values.get("--gpu"), values.get("--template"))


def push_request(argv: list[str]) -> PushRequest | None:
    """The push that argv asks for when it is `dataset push DIR [--name N | -n N] [--output
    table|json | -o ...]` (each option at most once, `--name=N` too); None otherwise."""
    if len(argv) < 3 or argv[:2] != ["dataset", "push"]:
        return None
    directory: str | None = None
    values: dict[str, str] = {}
    rest = argv[2:]
    index = 0
    while index < len(rest):
        item = rest[index]
        index += 1
        if not item.startswith("-"):
            if directory is not None:
                return None
            directory = item
            continue
        option, sep, value = item.partition("=")
        if not option.startswith("--") and sep:
            return None  # `-n=x` names "=x" to Typer: leave it its own reading
        if not sep:
            if index == len(rest):
                return None
            value, index = rest[index], index + 1
        key = _PUSH_OPTIONS.get(option)
        if key is None or key in values or not value or value.startswith("-"):
            return None
        values[key] = value
    output = values.get("output", "table")
    if directory is None or output not in ("table", "json"):
        return None
    return PushRequest(directory, values.get("name"), output == "json")


def _parse(
    argv: list[str], valued: tuple[str, ...]
) -> tuple[list[str], dict[str, str], dict[str, str]] | None:
    """`[OPTION VALUE | -e K=V]... -- COMMAND...` with OPTION one of valued, each at most
    once: the command, the env and the options' values; None for anything else."""
    if "--" not in argv:
        return None
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    env: dict[str, str] = {}
    values: dict[str, str] = {}
    index = 0
    while index < len(options):
        option, sep, value = options[index].partition("=")
        if not sep:
            if index + 1 == len(options):
                return None
            index += 1
            value = options[index]
        if option in ("--env", "-e") and (option == "--env" or not sep):
            key, sep, item = value.partition("=")
            if not sep or not _ENV_NAME.match(key):
                return None
            env[key] = item
        elif option in valued and option not in values and value and not value.startswith("-"):
            values[option] = value
        else:
            return None
        index += 1
    return (command, env, values) if command else None


def quick_exec(request: ExecRequest) -> int | None:
    """Run the exec on the quick path; its exit code, or None when it left it to the Typer
    app before sending anything (no saved login, a proxy)."""

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
            after, end = _print_until_end(started.messages)
            if end is not None:
                code = shell_exit_code(end.get("exit_code"), str(end.get("status")))
                if code is not None:
                    return code  # else the SDK's path says why it failed
    except KeyboardInterrupt:
        sys.stderr.write(
            f"run {run_id} keeps running; follow it with `gpulease logs {run_id} -f`\n"
        )
        return EXIT_INTERRUPTED
    return _resume(request.ref, started.started_json, after)


def _print_until_end(messages: Iterator[SseMessage]) -> tuple[int, dict[str, Any] | None]:
    """The run's output written as its events come, until its end event: the last chunk
    written (-1: none) and the end's JSON (None when the answer stopped before it)."""
    import json

    after = -1
    for message in messages:
        if message.event == "log":
            chunk = json.loads(message.data)
            if int(chunk["seq"]) > after:
                _write(chunk)
                after = int(chunk["seq"])
        elif message.event == "end":
            return after, json.loads(message.data)
    return after, None


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


def quick_push(request: PushRequest) -> int | None:
    """An unchanged re-push without the Typer app: the tree scanned while the server is
    asked for its current version, and the scan compared with the push index's record of
    the tree last pushed, as the SDK's push begins (client/datasets.py). When the index
    says the server holds this very tree, print what `gpulease dataset push` prints for it
    and return 0; anything else (no saved login or index, a changed tree, a refused path, a
    refusal or no answer from the server) is None, having printed nothing: the Typer app
    then pushes, or says what is wrong, from the start, taking over this path's scan of the
    tree where there was one (client/scan.hand_over) rather than scanning it again."""
    import json
    import time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from gpulease.cli.push_words import push_report, unchanged_text
    from gpulease.client import quickexec
    from gpulease.client.config import resolve_login, trusted_certificate
    from gpulease.client.errors import ClientError
    from gpulease.client.push_index import PushIndex, index_path
    from gpulease.client.scan import hand_over, scan_tree, taken_over
    from gpulease.core.datasets import check_dataset_name
    from gpulease.core.errors import InvalidInput

    login = resolve_login()
    if login.server is None or login.token is None:
        return None
    root = Path(request.directory)
    name = request.name or root.resolve().name
    try:
        check_dataset_name(name)  # and so a plain path part
    except InvalidInput:
        return None
    index_file = index_path(login.server, name)
    if not index_file.is_file():
        return None  # never pushed from here: nothing to compare the tree with
    started = time.monotonic()
    trusted = trusted_certificate(login.server)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="current") as asking:
        asked = asking.submit(
            quickexec.call_json,
            login.server,
            login.token,
            trusted,
            "GET",
            f"/datasets/{name}/current",
        )
        try:
            tree = scan_tree(root)
            hand_over(root, tree)  # the Typer push takes this scan if it has to push
            current = asked.result()
        except (quickexec.Declined, ClientError, OSError, ValueError):
            return None
    dataset, digest = current.get("dataset"), current.get("manifest_sha256")
    if not isinstance(dataset, dict) or not isinstance(digest, str):
        return None
    index = PushIndex(index_file)
    try:
        if index.tree_manifest(*tree.digest()) != digest:
            return None
    finally:
        index.close()
    taken_over(root)  # settled here: the scan goes to no push
    seconds = time.monotonic() - started
    if request.json:
        found = push_report(
            dataset,
            push_id=None,
            files=tree.count,
            size=tree.size,
            sent_chunks=0,
            sent_bytes=0,
            index_hits=tree.count,
            unchanged=True,
            seconds=seconds,
        )
        sys.stdout.write(json.dumps(found, indent=2) + "\n")
    else:
        version = dataset.get("current_version")  # the server's answer for dataset `name`
        sys.stdout.write(unchanged_text(name, version, tree.count, tree.size, seconds) + "\n")
    return 0


def quick_run(request: RunRequest) -> int | None:
    """Make the run's instance and its run with two quick requests, wait for the scheduler
    to place it and print the run's output as it comes; the end (its exit code and last
    line) and whatever this path does not do (a queued instance that waits, a broken
    stream) are the Typer app's `run` (cli/runs.resume_run). Its exit code, or None when it
    left everything to the Typer app before sending anything (no saved login, a proxy)."""
    from gpulease.client import quickexec
    from gpulease.client.config import resolve_login, trusted_certificate
    from gpulease.client.errors import ApiError, ClientError
    from gpulease.core.run_commands import command_text, first_line

    login = resolve_login()
    if login.server is None or login.token is None:
        return None
    server, token, trusted = login.server, login.token, trusted_certificate(login.server)
    template = request.template or "pytorch"  # as `run`'s --template
    body = {"gpu": request.gpu, "template": template, "auto_release": True}
    try:
        instance = quickexec.call_json(server, token, trusted, "POST", "/instances", body)
        instance_id = int(instance["id"])
        name = str(instance.get("name", instance_id))
    except quickexec.Declined:
        return None
    except (ClientError, KeyError, TypeError, ValueError) as exc:
        message = exc.message if isinstance(exc, ClientError) else f"unexpected answer: {exc}"
        sys.stderr.write(f"error: {message}\n")
        return 1
    # RunCreate.of_task of the command's task: its script, env, and the instance stops at
    # its end (then it is released)
    run = {
        "command": command_text(request.command).rstrip(),
        "env": request.env,
        "stop_instance_on_exit": True,
    }
    run_id: int | None = None
    try:
        path = f"/instances/{instance_id}/runs"
        run_id = int(quickexec.call_json(server, token, trusted, "POST", path, run)["id"])
    except (ApiError, KeyError, TypeError, ValueError):
        pass  # refused: `run` asks again, says why and releases the instance
    except ClientError as exc:  # no answer: the run may be there or not; give it all up
        sys.stderr.write(f"error: {exc.message}\n")
        return _give_up(instance_id, name, 1)
    except KeyboardInterrupt:
        return _give_up(instance_id, name, EXIT_INTERRUPTED)
    if run_id is not None:
        instance = _placed(server, token, trusted, instance)
    if run_id is None or instance.get("status") not in ("starting", "running"):
        return _resume_run(request, instance_id, run_id)  # `run` says what it waits for
    status, said = instance.get("status"), instance.get("status_message")
    sys.stderr.write(f"instance {instance_id} {name}: {status}")
    sys.stderr.write(f": {said}\n" if said else "\n")
    sys.stderr.write(f"run {run_id}: {first_line(command_text(request.command))}\n")
    after, end = -1, None
    try:
        path = f"/runs/{run_id}/stream?logs=true&metrics=false&since=-1:0"
        after, end = _print_until_end(quickexec.open_stream(server, token, trusted, path))
    except (ClientError, KeyError, TypeError, ValueError):
        pass  # `run` follows the stream from where it broke
    except KeyboardInterrupt:
        return _give_up(instance_id, name, EXIT_INTERRUPTED)
    return _resume_run(request, instance_id, run_id, (after, end))


def _placed(server: str, token: str, trusted: Any, instance: dict[str, Any]) -> dict[str, Any]:
    """The instance once the scheduler has placed it or said why it waits (a new one is
    queued until its next tick, a fraction of a second on an idle node), looked at every
    PLACED_POLL_S for up to PLACED_WAIT_S; as it was if that cannot be told."""
    import time

    from gpulease.client import quickexec
    from gpulease.client.errors import ClientError

    deadline = time.monotonic() + PLACED_WAIT_S
    while instance.get("status") == "queued" and not instance.get("status_message"):
        if time.monotonic() > deadline:
            break
        time.sleep(PLACED_POLL_S)
        try:
            instance = quickexec.call_json(
                server, token, trusted, "GET", f"/instances/{int(instance['id'])}"
            )
        except (ClientError, KeyError, TypeError, ValueError):
            break
    return instance


def _resume_run(
    request: RunRequest,
    instance_id: int,
    run_id: int | None,
    streamed: tuple[int, dict[str, Any] | None] | None = None,
) -> int:
    from gpulease.cli.main import reported
    from gpulease.cli.runs import resume_run

    return reported(
        lambda: resume_run(
            request.command,
            request.gpu,
            request.template,
            request.env,
            instance_id,
            run_id,
            streamed,
        )
    )


def _give_up(instance_id: int, name: str, code: int) -> int:
    """The instance released (nothing else would: its run was never sent); code."""
    from gpulease.cli.main import reported
    from gpulease.cli.runs import release_instance

    sys.stderr.write(f"releasing instance {name}\n")
    reported(lambda: release_instance(instance_id, name))
    return code


def main() -> None:
    """The console script."""
    argv = sys.argv[1:]
    request = exec_request(argv)
    if request is not None:
        code = quick_exec(request)
        if code is not None:
            sys.exit(code)
    elif (run := run_request(argv)) is not None:
        code = quick_run(run)
        if code is not None:
            sys.exit(code)
    elif (push := push_request(argv)) is not None:
        code = quick_push(push)
        if code is not None:
            sys.exit(code)
    from gpulease.cli.main import app

    app()
