"""The `gpulease` command: every command group, and one place that turns errors into messages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from pydantic import ValidationError
from typer.core import TyperGroup

from gpulease.cli import accounts, backup, billing, catalog, instances, runs, server, wallets
from gpulease.cli import autostop as autostop_commands
from gpulease.cli import datasets as dataset_commands
from gpulease.cli import doctor as doctor_commands
from gpulease.cli import estimates as estimate_commands
from gpulease.cli import metrics as metric_commands
from gpulease.cli import quotas as quota_commands
from gpulease.cli import simulate as simulate_commands
from gpulease.cli import statements as statement_commands
from gpulease.cli import support as support_commands
from gpulease.cli import sweeps as sweep_commands
from gpulease.cli.output import fail
from gpulease.client import ClientError
from gpulease.core.errors import GpuleaseError, InvalidInput


class _ReportingGroup(TyperGroup):
    """Refusals become `error: <what the server said>` on stderr and exit 1 (2 for bad
    input such as a malformed task file), never a traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ClientError as exc:
            fail(exc.message, 1)
        except GpuleaseError as exc:
            fail(exc.message, 2 if isinstance(exc, InvalidInput) else 1)
        except ValidationError as exc:  # a request body the SDK refused to send
            fail(_invalid_body_text(exc), 2)


def _invalid_body_text(exc: ValidationError) -> str:
    """Pydantic's complaint about a request body, one `field: problem` per error."""
    parts = []
    for problem in exc.errors():
        where = ".".join(str(p) for p in problem.get("loc", ()))
        parts.append(f"{where}: {problem['msg']}" if where else str(problem["msg"]))
    return "; ".join(parts)


app = typer.Typer(
    name="gpulease",
    cls=_ReportingGroup,
    help="Rent GPUs on a gpulease server, run jobs on them, pay for what you use.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

# Every command under its name: `gpulease NAME` ...
COMMANDS: dict[str, Callable[..., None]] = {
    "server": server.server,
    "backup": backup.backup,
    "restore": backup.restore,
    "register": accounts.register,
    "login": accounts.login,
    "logout": accounts.logout,
    "whoami": accounts.whoami,
    "gpus": catalog.gpus,
    "nodes": catalog.nodes,
    "doctor": doctor_commands.doctor,  # driver, CUDA and framework checks
    "simulate": simulate_commands.simulate,  # replay a trace through the policies
    "exec": runs.exec_,
    "run": runs.run,
    "logs": runs.logs,
    "runs": runs.runs,
    "metrics": metric_commands.metrics,
    "balance": billing.balance,
    "usage": billing.usage,
    "plans": wallets.plans,
    "offpeak": wallets.offpeak,
    "estimate": estimate_commands.estimate,
    "statement": statement_commands.statement,
}
# ... and `gpulease admin NAME`, beside the ones billing.admin_app declares itself.
ADMIN_COMMANDS: dict[str, Callable[..., None]] = {
    "grant-team": wallets.admin_grant_team,
    "limits": wallets.admin_limits,
    "offpeak-add": wallets.admin_offpeak_add,
    "offpeak-rm": wallets.admin_offpeak_rm,
    "voucher-create": wallets.admin_voucher_create,
    "vouchers": wallets.admin_voucher_ls,
    "revenue": statement_commands.revenue,
    "rotate-master-key": dataset_commands.rotate_master_key,
}
GROUPS: dict[str, typer.Typer] = {
    "token": accounts.token_app,
    "templates": catalog.templates_app,  # the catalog's and your own
    "instance": instances.instance_app,
    "admin": billing.admin_app,
    "voucher": wallets.voucher_app,
    "limits": wallets.limits_app,
    "team": wallets.team_app,
    "dataset": dataset_commands.dataset_app,
    "ticket": support_commands.ticket_app,  # support tickets
    "sweep": sweep_commands.sweep_app,  # a task over a search space, trial by trial
}

autostop_commands.register(instances.instance_app)  # instance autostop, schedule, resize
for name, command in COMMANDS.items():
    app.command(name)(command)
for name, command in ADMIN_COMMANDS.items():
    billing.admin_app.command(name)(command)
billing.admin_app.add_typer(quota_commands.quota_app, name="quota")
for name, group in GROUPS.items():
    app.add_typer(group, name=name)
