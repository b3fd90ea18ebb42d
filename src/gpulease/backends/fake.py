"""A backend without processes, for server tests: it records calls and fakes liveness."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulease.backends.base import RunnerSpec


@dataclass
class FakeRunner:
    spec: RunnerSpec
    alive: bool = True
    stop_calls: list[bool] = field(default_factory=list)  # the force flag of each stop()


class FakeBackend:
    """Starts nothing. `runners[handle]` tells what happened; tests flip `alive` to play a
    crash. stop() ends the fake runner at once unless `stop_kills` is False (a runner that
    hangs); `start_error` makes the next start() raise it."""

    name = "fake"

    def __init__(self) -> None:
        self.same_host = False  # tests set it to see what a local backend's runners get
        self.runners: dict[str, FakeRunner] = {}
        self.stop_kills = True
        self.start_error: Exception | None = None
        self.deleted_workspaces: list[tuple[str, str]] = []  # (node, name) of delete_workspace

    def start(self, spec: RunnerSpec) -> str:
        if self.start_error is not None:
            error, self.start_error = self.start_error, None
            raise error
        handle = f"fake-{len(self.runners) + 1}"
        self.runners[handle] = FakeRunner(spec=spec)
        return handle

    def alive(self, handle: str) -> bool:
        runner = self.runners.get(handle)
        return runner is not None and runner.alive

    def stop(self, handle: str, *, force: bool = False) -> None:
        runner = self.runners.get(handle)
        if runner is None:
            return
        runner.stop_calls.append(force)
        if self.stop_kills or force:
            runner.alive = False

    def delete_workspace(self, node: str, name: str) -> None:
        self.deleted_workspaces.append((node, name))

    def set_alive(self, handle: str, alive: bool) -> None:
        self.runners[handle].alive = alive

    @property
    def started(self) -> list[RunnerSpec]:
        return [runner.spec for runner in self.runners.values()]

    def handle_for(self, instance_id: int) -> str | None:
        """The newest handle started for an instance."""
        for handle in reversed(self.runners):
            if self.runners[handle].spec.instance_id == instance_id:
                return handle
        return None
