"""The `gpulease` command: every command group, and one place that turns errors into messages."""

from __future__ import annotations

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
from gpulease.cli import simulate as simulate_commands
from gpulease.cli import statements as statement_commands
from gpulease.cli import support as support_commands
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

app.command("server")(server.server)
app.command("backup")(backup.backup)
app.command("restore")(backup.restore)

app.command("register")(accounts.register)
app.command("login")(accounts.login)
app.command("logout")(accounts.logout)
app.command("whoami")(accounts.whoami)
app.add_typer(accounts.token_app, name="token")

app.command("gpus")(catalog.gpus)
app.add_typer(catalog.templates_app, name="templates")  # the catalog's and your own
app.command("nodes")(catalog.nodes)
app.command("doctor")(doctor_commands.doctor)  # driver, CUDA and framework checks
app.command("simulate")(simulate_commands.simulate)  # replay a trace through the policies

autostop_commands.register(instances.instance_app)  # instance autostop, schedule, resize
app.add_typer(instances.instance_app, name="instance")
app.command("exec")(runs.exec_)
app.command("run")(runs.run)
app.command("logs")(runs.logs)
app.command("runs")(runs.runs)
app.command("metrics")(metric_commands.metrics)

app.command("balance")(billing.balance)
app.command("usage")(billing.usage)
app.add_typer(billing.admin_app, name="admin")

app.command("plans")(wallets.plans)
app.command("offpeak")(wallets.offpeak)
app.add_typer(wallets.voucher_app, name="voucher")
app.add_typer(wallets.limits_app, name="limits")
app.add_typer(wallets.team_app, name="team")
billing.admin_app.command("grant-team")(wallets.admin_grant_team)
billing.admin_app.command("limits")(wallets.admin_limits)
billing.admin_app.command("offpeak-add")(wallets.admin_offpeak_add)
billing.admin_app.command("offpeak-rm")(wallets.admin_offpeak_rm)
billing.admin_app.command("voucher-create")(wallets.admin_voucher_create)
billing.admin_app.command("vouchers")(wallets.admin_voucher_ls)

app.command("estimate")(estimate_commands.estimate)
app.command("statement")(statement_commands.statement)
billing.admin_app.command("revenue")(statement_commands.revenue)

app.add_typer(dataset_commands.dataset_app, name="dataset")
app.add_typer(support_commands.ticket_app, name="ticket")  # support tickets
billing.admin_app.command("rotate-master-key")(dataset_commands.rotate_master_key)
