"""`gpulease run` for a multi-node task: one run per rank, rank 0 followed, the other ranks'
output printed beside it line by line, each line prefixed `(rank K)`; rank 0's lines come
unprefixed but whole too, so no two ranks' lines ever share one."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from gpulease.cli.instances import wait_until_started
from gpulease.cli.output import error, note
from gpulease.cli.retry import Attempt
from gpulease.client import ClientError, EndEvent, GpuleaseClient, LogEvent, WorkdirArchive
from gpulease.core.taskspec import TaskSpec
from gpulease.schemas.instances import InstancePublic
from gpulease.schemas.runs import LogChunkPublic, RunCreate, RunPublic

EXIT_INTERRUPTED = 130
# How long the other ranks' output may still trail rank 0's end.
TRAIL_S = 30.0


class RankPrinter:
    """Writes one rank's output as whole lines, each prefixed `(rank K) ` (unless `prefixed`
    is false: the followed rank 0), on the stream the job used; lines of different ranks
    never interleave mid-line."""

    lock = threading.Lock()

    def __init__(self, rank: int, prefixed: bool = True) -> None:
        self.prefix = f"(rank {rank}) " if prefixed else ""
        self.partial = {"stdout": "", "stderr": ""}

    def write(self, chunk: LogChunkPublic) -> None:
        stream = "stderr" if chunk.stream == "stderr" else "stdout"
        text = self.partial[stream] + chunk.data
        *lines, self.partial[stream] = text.split("\n")
        self._emit(stream, lines)

    def close(self) -> None:
        for stream, rest in self.partial.items():
            if rest:
                self._emit(stream, [rest])
            self.partial[stream] = ""

    def _emit(self, stream: str, lines: list[str]) -> None:
        if not lines:
            return
        out = sys.stderr if stream == "stderr" else sys.stdout
        with self.lock:
            out.write("".join(f"{self.prefix}{line}\n" for line in lines))
            out.flush()


def gang_members(client: GpuleaseClient, leader: InstancePublic) -> list[InstancePublic]:
    """The gang's instances in rank order (rank 0 is `leader`)."""
    found = [i for i in client.instances.list() if i.gang_id == leader.id]
    return sorted(found, key=lambda i: i.gang_rank or 0)


def run_gang(
    client: GpuleaseClient,
    spec: TaskSpec,
    leader: InstancePublic,
    archive: WorkdirArchive | None,
    release: Callable[[int, str], None],
    follow: Callable[[int, Callable[[LogChunkPublic], None]], EndEvent],
    finish: Callable[[int, int], str],
    exit_code: Callable[[int, EndEvent], int],
) -> Attempt:
    """Start the task on every rank of the gang led by `leader`, follow rank 0 (with
    `follow`, given the writer for its output) and print the others' output prefixed; rank
    0's exit code is the task's."""
    members = gang_members(client, leader)
    note(f"{len(members)} nodes: instances {', '.join(m.name for m in members)}")
    runs: list[RunPublic] = []
    try:
        try:
            for member in members:
                if archive is not None:
                    client.instances.upload_workdir(member.id, archive)
                runs.append(client.runs.create(member.id, RunCreate.of_task(spec)))
        except ClientError:
            for member in members:
                release(member.id, member.name)
            raise
        for member in members:
            wait_until_started(client, member.id)
        followers = [
            threading.Thread(target=_print_rank, args=(client, run.id, rank), daemon=True)
            for rank, run in enumerate(runs)
            if rank > 0
        ]
        for thread in followers:
            thread.start()
        leader_printer = RankPrinter(0, prefixed=False)
        try:
            end = follow(runs[0].id, leader_printer.write)
        finally:
            leader_printer.close()
        for thread in followers:
            thread.join(TRAIL_S)
    except KeyboardInterrupt:
        note(f"interrupted: releasing the {len(members)} instances of the task")
        for member in members:
            release(member.id, member.name)
        return Attempt(EXIT_INTERRUPTED, leader.id, leader.name, None)
    for rank, run in enumerate(runs):
        try:
            note(f"(rank {rank}) {finish(run.id, members[rank].id)}")
        except ClientError as exc:
            note(f"(rank {rank}) run {run.id} ended; its cost could not be read: {exc.message}")
    return Attempt(exit_code(runs[0].id, end), leader.id, leader.name, end)


def _print_rank(client: GpuleaseClient, run_id: int, rank: int) -> None:
    printer = RankPrinter(rank)
    try:
        for event in client.runs.stream(run_id, metrics=False):
            if isinstance(event, LogEvent):
                printer.write(event.chunk)
            elif isinstance(event, EndEvent):
                return
    except ClientError as exc:
        error(f"(rank {rank}) lost its output: {exc.message}; see `gpulease logs {run_id}`")
    finally:
        printer.close()
