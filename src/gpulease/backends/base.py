"""The backend contract: place a runner for an instance, check it, stop it.

Everything after a runner starts is the same HTTP conversation with the server whatever the
backend, which is what lets the local and Ray backends behave alike.
"""

from __future__ import annotations

from typing import Protocol

from gpulease.schemas.runner import RunnerSpec

__all__ = ["Backend", "RunnerSpec"]


class Backend(Protocol):
    """Where runners live. Implementations must be safe to call from any reconciler tick.

    A handle is an opaque string the backend returns from start() and the server stores
    in the database; it must identify the runner across server restarts (a pid alone does
    not: pids are reused).
    """

    name: str
    # Runners start on the server's own host: they can reach its Unix socket
    # (server/runner_socket.py), and the launcher gives it to them instead of TCP.
    same_host: bool

    def start(self, spec: RunnerSpec) -> str:
        """Start a detached runner for spec and return its handle. The runner must outlive
        the server process (its own session), so a server restart never kills user jobs."""
        ...

    def alive(self, handle: str) -> bool:
        """True while the runner behind handle is still running. Cheap; no network."""
        ...

    def stop(self, handle: str, *, force: bool = False) -> None:
        """Ask the runner to stop (SIGTERM), or kill it and its jobs when force is set.
        Idempotent and fast: returns at once, also for a handle whose runner is gone."""
        ...

    def delete_workspace(self, node: str, name: str) -> None:
        """Delete a released instance's workspace `name` (and its runner's files) on node,
        where the backend keeps them apart from the server's disk. Fast and idempotent:
        it may only ask the node to do it; a node that is gone is skipped. A same_host
        backend has nothing to do (the server deletes the workspace on its own disk)."""
        ...
