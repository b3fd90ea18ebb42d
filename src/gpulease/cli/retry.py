"""`gpulease run --retry N`: a task whose instance failed under it (its node left the cluster,
its runner died) runs again on a new instance, which the scheduler places on a node that is
still there. A task that ended on its own (any exit code) or was stopped is not retried.

The server queues some instances again by itself, with their interrupted run queued on them
again (a spot instance preempted, or on a node that left): `gpulease run` follows that run
(requeued_run) rather than ending with the interrupted one."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gpulease.cli.output import note
from gpulease.client import ClientError, EndEvent, GpuleaseClient
from gpulease.core.taskspec import MAX_RETRIES
from gpulease.schemas.runs import RunPublic

__all__ = ["MAX_RETRIES", "Attempt", "failure_under", "requeued_run", "with_retries"]

# A stopping or stopped instance its owner still wants running is queued again once it has
# stopped (a preemption's grace is 30 s by default): wait this long for that at most.
REQUEUE_WAIT_S = 120.0
POLL_S = 0.2


@dataclass(frozen=True)
class Attempt:
    """How one try of a task ended: the shell's exit code, its instance, the run's end
    (None when it never got that far: interrupted, or refused before it ran)."""

    code: int
    instance_id: int
    instance_name: str
    end: EndEvent | None


def failure_under(client: GpuleaseClient, attempt: Attempt) -> str | None:
    """Why the attempt's instance failed under its run, or None when the run ended on its
    own (an exit code, success) or its instance did not fail (stopped, out of credit)."""
    end = attempt.end
    if end is None or end.exit_code is not None or end.status == "succeeded":
        return None
    try:
        instance = client.instances.get(attempt.instance_id)
    except ClientError:
        return None
    if instance.status != "failed":
        return None
    return f"instance {instance.name} failed: {instance.status_reason or 'no reason given'}"


def with_retries(
    client: GpuleaseClient,
    retries: int,
    attempt: Callable[[], Attempt],
    release: Callable[[int, str], None],
) -> int:
    """Run attempt() up to 1 + retries times, again only after an instance failure
    (failure_under); the failed instance is released first. Returns the last exit code."""
    for left in range(retries, -1, -1):
        result = attempt()
        why = failure_under(client, result) if left else None
        if why is None:
            return result.code
        release(result.instance_id, result.instance_name)
        plural = "retry" if left == 1 else "retries"
        note(f"{why}; running the task again on a new instance ({left} {plural} left)")
    raise AssertionError("not reached: the last attempt always returns")


def requeued_run(
    client: GpuleaseClient,
    instance_id: int,
    run: RunPublic,
    *,
    wait_s: float = REQUEUE_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> RunPublic | None:
    """The run the server queued again on the instance in place of `run`, which has ended,
    or None when there is none: the task is over (its instance is being released, or was
    stopped or released by its owner, or failed). While the instance is stopping or stopped
    and its owner still wants it running (a preemption's grace, a node that left), the
    requeue is coming: wait for it, up to wait_s."""
    for _ in range(max(1, int(wait_s / POLL_S))):
        try:
            instance = client.instances.get(instance_id)
            runs = client.runs.list(instance_id=instance_id)
        except ClientError:
            return None
        # it may have run already (its stream replays it): any later run of the same command
        again = [r for r in runs if r.id > run.id and r.command == run.command]
        if again:
            return min(again, key=lambda r: r.id)
        if instance.desired_state != "running" or instance.status not in ("stopping", "stopped"):
            return None
        sleep(POLL_S)
    return None
