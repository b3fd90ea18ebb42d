"""The `gpulease` command: every command group, and one place that turns errors into messages.

Commands are loaded lazily: `gpulease gpus` imports cli/catalog.py and what it needs, not
the modules of every other command, and `gpulease --help` imports none of them (it lists
each command with the help text kept in COMMANDS). tests/cli/test_cli_imports.py checks
that each kept text is the first paragraph of its command's own help.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any, NoReturn

import typer
import typer.main
from typer._click import Command, Context, HelpFormatter
from typer.core import DEFAULT_MARKUP_MODE, TyperGroup
from typer.models import CommandInfo


@dataclass(frozen=True)
class Lazy:
    """A command or command group of `gpulease`, imported only when it is used."""

    load: Callable[[], Callable[..., None] | typer.Typer]
    help: str  # the first paragraph of its help, for `gpulease --help`


def _attribute(module: str, name: str) -> Callable[[], Any]:
    """A loader of gpulease.cli.MODULE.NAME."""
    return lambda: getattr(importlib.import_module(f"gpulease.cli.{module}"), name)


def _command(module: str, name: str, text: str) -> Lazy:
    return Lazy(_attribute(module, name), text)


@functools.cache
def _instance_group() -> typer.Typer:
    """`gpulease instance`, with autostop, schedule and resize (cli/autostop.py)."""
    from gpulease.cli import autostop, instances

    autostop.register(instances.instance_app)
    return instances.instance_app


@functools.cache
def _admin_group() -> typer.Typer:
    """`gpulease admin`: billing.admin_app's own commands, these, and `admin quota`."""
    from gpulease.cli import billing, datasets, quotas, statements, wallets

    commands: dict[str, Callable[..., None]] = {
        "grant-team": wallets.admin_grant_team,
        "limits": wallets.admin_limits,
        "offpeak-add": wallets.admin_offpeak_add,
        "offpeak-rm": wallets.admin_offpeak_rm,
        "voucher-create": wallets.admin_voucher_create,
        "vouchers": wallets.admin_voucher_ls,
        "revenue": statements.revenue,
        "rotate-master-key": datasets.rotate_master_key,
    }
    for name, command in commands.items():
        billing.admin_app.command(name)(command)
    billing.admin_app.add_typer(quotas.quota_app, name="quota")
    return billing.admin_app


# Every command under its name, in the order `gpulease --help` lists them.
COMMANDS: dict[str, Lazy] = {
    "server": _command(
        "server",
        "server",
        "Run the gpulease server here (settings from GPULEASE_* environment variables).",
    ),
    "backup": _command(
        "backup",
        "backup",
        "Back up this server's data (GPULEASE_* settings): database, blobs, workspaces at rest.",
    ),
    "restore": _command(
        "backup",
        "restore",
        "Restore a backup into this server's data directory and database (server stopped).",
    ),
    "register": _command(
        "accounts", "register", "Create an account on a server and stay logged in to it."
    ),
    "login": _command(
        "accounts", "login", "Log in to a server; the token is saved for the next commands."
    ),
    "logout": _command(
        "accounts",
        "logout",
        "Revoke the saved token on the server and forget it here (the server URL stays).",
    ),
    "whoami": _command("accounts", "whoami", "Who the saved login is, on which server."),
    "gpus": _command(
        "catalog",
        "gpus",
        "GPU models: memory, NCU factor, price per hour and how many are free now.",
    ),
    "nodes": _command("catalog", "nodes", "GPU hosts and their state (admins only)."),
    "doctor": _command(
        "doctor",
        "doctor",
        "Check the NVIDIA driver, the CUDA it supports, torch/torchvision/jax builds, "
        "torch.cuda.is_available() and CUDA_VISIBLE_DEVICES, and print a fix for each problem. "
        "Inside an instance, `python -m gpulease.doctor` runs the same checks.",
    ),
    "simulate": _command(
        "simulate",
        "simulate",
        "Replay TRACE through the same schedule() the server runs, one policy at a time.",
    ),
    "exec": _command(
        "runs",
        "exec_",
        "Run a command in an instance and stream its output; exits with its exit code.",
    ),
    "run": _command(
        "runs",
        "run",
        "Rent an instance for one task: upload the workdir, run, stream the output, release.",
    ),
    "logs": _command(
        "runs", "logs", "Print a run's output (stdout and stderr as the job wrote them)."
    ),
    "runs": _command("runs", "runs", "Your runs, newest first."),
    "metrics": _command(
        "metrics",
        "metrics",
        "The metrics a run logged: latest step and value, lowest, highest, how many points.",
    ),
    "balance": _command(
        "billing", "balance", "Your credit, in money and in NCU (1 NCU = one A100 for 24 hours)."
    ),
    "usage": _command(
        "billing",
        "usage",
        "What you were billed, as the Billing page's bill: one line per instance session and "
        'day ("box: A100-80GB × 1, on demand, 2 h 14 min"), grants and vouchers, newest first.',
    ),
    "plans": _command(
        "wallets",
        "plans",
        "Prices of each plan for a GPU request, and the rules you accept by choosing one.",
    ),
    "offpeak": _command("wallets", "offpeak", "Off-peak windows: when GPUs cost less."),
    "estimate": _command(
        "estimates",
        "estimate",
        "Expected GPU-hours, wall time, NCU and cost of training an image classifier, for "
        "every GPU model in this server's catalog, at its prices.",
    ),
    "statement": _command(
        "statements",
        "statement",
        "Your usage and charges for a period: by GPU model, day, instance and kind.",
    ),
    "token": _command("accounts", "token_app", "API tokens for scripts and other machines."),
    "templates": _command(
        "catalog",
        "templates_app",
        "Environment templates: list them with where they run; save an instance's as yours.",
    ),
    "instance": Lazy(
        _instance_group, "Rent GPUs: create, list, stop, start and release instances."
    ),
    "admin": Lazy(_admin_group, "Operator commands (admin accounts only)."),
    "voucher": _command("wallets", "voucher_app", "Redeem credit vouchers."),
    "limits": _command("wallets", "limits_app", "Your spending caps and low-balance warning."),
    "team": _command("wallets", "team_app", "Teams: a shared wallet and its members."),
    "dataset": _command(
        "datasets",
        "dataset_app",
        "Datasets: push a directory once, mount it read-only at /data/NAME in instances.",
    ),
    "ticket": _command(
        "support",
        "ticket_app",
        "Support tickets: ask the operators for help, read and answer their replies.",
    ),
    "sweep": _command(  # a task over a search space, trial by trial
        "sweeps",
        "sweep_app",
        "Hyperparameter sweeps: one task run once per point of a grid or of random draws, "
        "each trial on its own instance; `gpulease sweep task.yaml --grid lr=0.1,0.01`.",
    ),
}


def click_command(name: str, target: Callable[..., None] | typer.Typer) -> Command:
    """The click command Typer makes of a command function or a Typer group, as `name`."""
    if isinstance(target, typer.Typer):
        group = typer.main.get_group(target)
        group.name = name
        return group
    return typer.main.get_command_from_info(
        CommandInfo(name=name, callback=target),
        pretty_exceptions_short=True,
        rich_markup_mode=DEFAULT_MARKUP_MODE,
    )


class _LazyCommands(MutableMapping[str, Command]):
    """A group's commands: those Typer registered, then COMMANDS, each made on first use."""

    def __init__(self, registered: MutableMapping[str, Command]) -> None:
        self._made = dict(registered)

    def __getitem__(self, name: str) -> Command:
        if name not in self._made:
            if name not in COMMANDS:
                raise KeyError(name)
            self._made[name] = click_command(name, COMMANDS[name].load())
        return self._made[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._made[name] = command

    def __delitem__(self, name: str) -> None:
        del self._made[name]

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (name for name in self._made if name not in COMMANDS)

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self._made))


class _ReportingGroup(TyperGroup):
    """The top-level group: lazy commands; refusals become `error: <what the server said>`
    on stderr and exit 1 (2 for bad input such as a malformed task file), never a traceback."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _LazyCommands(self.commands)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            _report(exc)

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        """The command list from COMMANDS' texts: nothing is imported to show it."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, lazy.help) for name, lazy in COMMANDS.items()])


def _report(exc: Exception) -> NoReturn:
    """Exit with a message for an error meant for people; re-raise anything else."""
    from pydantic import ValidationError

    from gpulease.cli.output import fail
    from gpulease.client.errors import ClientError
    from gpulease.core.errors import GpuleaseError, InvalidInput

    if isinstance(exc, ClientError):
        fail(exc.message, 1)
    if isinstance(exc, GpuleaseError):
        fail(exc.message, 2 if isinstance(exc, InvalidInput) else 1)
    if isinstance(exc, ValidationError):  # a request body the SDK refused to send
        fail(_invalid_body_text(exc), 2)
    raise exc


def reported(action: Callable[[], None]) -> int:
    """Run a command's code outside the app (cli/entry.py hands an exec over to it) as the
    app would: errors for people reported as _ReportingGroup does; the exit code."""
    try:
        try:
            action()
        except Exception as exc:
            _report(exc)
    except typer.Exit as exit_:
        return int(exit_.exit_code)
    return 0


def _invalid_body_text(exc: Any) -> str:
    """Pydantic's complaint about a request body, one `field: problem` per error."""
    parts = []
    for problem in exc.errors():
        where = ".".join(str(p) for p in problem.get("loc", ()))
        parts.append(f"{where}: {problem['msg']}" if where else str(problem["msg"]))
    return "; ".join(parts)


app = typer.Typer(
    name="gpulease",
    cls=_ReportingGroup,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,  # plain help here: `gpulease --help` imports no Rich
)


@app.callback()
def _gpulease() -> None:
    """Rent GPUs on a gpulease server, run jobs on them, pay for what you use."""
