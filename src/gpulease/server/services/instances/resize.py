"""Resize a stopped instance (another GPU model or count, or CPU only) and no-GPU starts.

The workspace is a directory named by the instance's id (lifecycle.create_instance), not by
its GPUs, so it is the same before and after a resize. The hourly rate follows the catalog
and the instance's plan; the next usage segment opens at the new rate.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpulease.core.catalog import CPU_MODEL, Catalog
from gpulease.core.errors import Conflict, InvalidInput
from gpulease.server.db import utcnow
from gpulease.server.orm import Instance
from gpulease.server.services import nodes
from gpulease.server.services.billing import plans
from gpulease.server.services.instances.states import FAILED, STOPPED

RESIZABLE = (STOPPED, FAILED)


def _shape(session: Session, catalog: Catalog, instance: Instance, model: str, count: int) -> None:
    name = nodes.check_request_fits(session, catalog, model, count)
    instance.gpu_model = name
    instance.gpu_count = count
    instance.hourly_micro = plans.hourly_rate(catalog.get(name), count, instance.plan)


def _check_no_reservation(instance: Instance, what: str) -> None:
    if plans.holds_reservation(instance, utcnow()):
        raise Conflict(
            f"instance {instance.name}'s daily block reserves its GPUs until "
            f"{instance.reserved_until:%Y-%m-%d %H:%M} UTC; {what} after the block ends"
        )


def resize(
    session: Session,
    catalog: Catalog,
    instance: Instance,
    *,
    gpu_model: str | None,
    gpu_count: int | None,
    no_gpu: bool = False,
) -> None:
    """Give a stopped instance another GPU model and/or count, or none (CPU only)."""
    if instance.status not in RESIZABLE:
        raise Conflict(
            f"instance {instance.name} is {instance.status}; only a stopped instance can be "
            f"resized: stop it first with `gpulease instance stop {instance.name}`"
        )
    _check_no_reservation(instance, "resize it")
    cpu = no_gpu or (gpu_model or "").strip().lower() in {"cpu", "none"}
    if cpu:
        if gpu_count:
            raise InvalidInput("a CPU-only instance takes no gpu_count; leave it out")
        model, count = CPU_MODEL, 0
    else:
        if not gpu_model or not gpu_model.strip():
            raise InvalidInput(
                'give gpu_model and gpu_count, e.g. {"gpu_model": "T4", "gpu_count": 2}, '
                'or {"no_gpu": true} for CPU only'
            )
        model, count = gpu_model.strip(), 1 if gpu_count is None else gpu_count
        catalog.get(model)  # an unknown model is bad input, whatever the nodes have
        if count < 1:
            raise InvalidInput(
                f"gpu_count must be at least 1 (got {count}); for CPU only send no_gpu: true"
            )
    _shape(session, catalog, instance, model, count)
    instance.resume_gpu_model = None
    instance.resume_gpu_count = None


def start_without_gpu(session: Session, catalog: Catalog, instance: Instance) -> None:
    """Before a no-GPU start: set the instance's GPUs aside (restore_gpus brings them back)
    and make it CPU only at the CPU price."""
    if instance.gpu_count == 0:
        return
    if instance.status not in RESIZABLE:
        raise Conflict(
            f"instance {instance.name} is {instance.status} with its GPUs; stop it first "
            "to start it without GPUs"
        )
    _check_no_reservation(instance, "start it without GPUs")
    model, count = instance.gpu_model, instance.gpu_count
    _shape(session, catalog, instance, CPU_MODEL, 0)
    instance.resume_gpu_model = model
    instance.resume_gpu_count = count


def restore_gpus(session: Session, catalog: Catalog, instance: Instance) -> None:
    """Before a plain start: give back the GPUs a no-GPU start set aside."""
    if instance.resume_gpu_model is None or instance.status not in RESIZABLE:
        return
    _shape(session, catalog, instance, instance.resume_gpu_model, instance.resume_gpu_count or 1)
    instance.resume_gpu_model = None
    instance.resume_gpu_count = None
