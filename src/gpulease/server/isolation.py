"""The server's start-up rule for tenant isolation: jobs can be isolated here (bubblewrap,
an unprivileged uid per instance, a firewalled network namespace per instance), or the
operator said, loudly, that this is a single-user server."""

from __future__ import annotations

import logging

from gpulease.core.errors import GpuleaseError
from gpulease.runner import sandbox
from gpulease.server.settings import Settings

log = logging.getLogger("gpulease.server")

UNSANDBOXED_WARNING = (
    "UNSANDBOXED SINGLE-USER MODE: jobs run without a sandbox, with this server's rights "
    "(they can read its database, keys and every workspace); sign-up is off. Give accounts "
    "to nobody you would not give this machine's data to."
)


class SandboxRequired(GpuleaseError):
    """The server would run tenants' jobs without isolation; it refuses to start."""


def require_sandbox(settings: Settings) -> None:
    """Return when jobs will be isolated (runner/sandbox.py's probe: bwrap, the drop to an
    instance uid and an instance network all work on this host) or the operator set
    GPULEASE_UNSANDBOXED_SINGLE_USER; raise SandboxRequired, saying what to do, otherwise."""
    if settings.unsandboxed_single_user:
        log.warning(UNSANDBOXED_WARNING)
        return
    reason = sandbox.probe()
    if reason is None:
        return
    raise SandboxRequired(
        "refusing to start: every job runs in a bubblewrap sandbox, as a uid of its own and on "
        "a network of its own (internet only, never this host's services), so that tenants "
        f"cannot reach each other's data or the server's, but {reason}. Fix that; "
        "or, only if you alone will use this server, set GPULEASE_UNSANDBOXED_SINGLE_USER=true "
        "(jobs then run unsandboxed and can read the server's database and keys; sign-up is "
        "turned off)"
    )
