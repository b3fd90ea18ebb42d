"""`gpulease run --retry N`: a task whose instance failed under it (its node left the cluster,
its runner died) runs again on a new instance, which the scheduler places on a node that is
still there. A task that ended on its own (any exit code) or was stopped is not retried."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpulease.cli.output import note
from gpulease.client import ClientError, EndEvent, GpuleaseClient
from gpulease.core.taskspec import MAX_RETRIES

__all__ = ["MAX_RETRIES", "Attempt", "failure_under", "with_retries"]


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
