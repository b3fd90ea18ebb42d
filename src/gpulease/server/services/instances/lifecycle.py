"""What renters ask of instances: create, list, show, stop, start, release."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog, parse_accelerators
from gpulease.core.errors import Conflict, InvalidInput, NotFound, PaymentRequired
from gpulease.core.ids import parse_id
from gpulease.core.money import cost_for_seconds, format_credits
from gpulease.scheduler.fifo import Request
from gpulease.server.db import utcnow
from gpulease.server.orm import Instance, User
from gpulease.server.services import ledger, nodes, templates
from gpulease.server.services.billing import limits, offpeak, plans, teams
from gpulease.server.services.instances import queue, resize
from gpulease.server.services.instances.states import (
    FAILED,
    QUEUED,
    RELEASED,
    RUNNING,
    STARTING,
    STOPPED,
    STOPPING,
    switch_status,
)

# A letter first: an all-digit ref means an id.
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


def upfront_cost(catalog: Catalog, instance: Instance, min_minutes: int) -> int:
    """What a start needs in the wallet: the daily block, or `min_minutes` at the rate."""
    if instance.plan == plans.DAILY:
        if plans.holds_reservation(instance, utcnow()):
            return 0
        return plans.block_price(catalog.get(instance.gpu_model), instance.gpu_count)
    return cost_for_seconds(instance.hourly_micro, min_minutes * 60)


def check_can_start(
    session: Session, catalog: Catalog, instance: Instance, min_minutes: int
) -> None:
    """Refuse a start the wallet cannot pay for or that would break a spending cap."""
    symbol = catalog.currency_symbol
    needed = upfront_cost(catalog, instance, min_minutes)
    balance = ledger.balance(session, instance.owner_id, instance.team_id)
    wallet = "the team's balance" if instance.team_id else "your balance"
    if needed and (balance <= 0 or balance < needed):
        what = (
            "a daily block costs"
            if instance.plan == plans.DAILY
            else f"this instance costs {format_credits(instance.hourly_micro, symbol)}/h and "
            f"needs for its first {min_minutes} minutes"
        )
        raise PaymentRequired(
            f"not enough credit: {what} {format_credits(needed, symbol)}; "
            f"{wallet} is {format_credits(balance, symbol)}. "
            "Redeem a voucher or ask an admin for credit."
        )
    limits.check_start(
        session,
        instance.owner_id,
        instance.team_id,
        instance.hourly_micro,
        needed,
        utcnow(),
        symbol,
    )


def create_instance(
    session: Session,
    owner: User,
    *,
    catalog: Catalog,
    gpu: str | None,
    template: str,
    name: str | None,
    auto_release: bool,
    min_start_minutes: int,
    workspaces: Path,
    awaiting_workdir: bool = False,
    plan: str = plans.ON_DEMAND,
    team: str | None = None,
    start_when_cheap: bool = False,
    auto_renew: bool = False,
) -> Instance:
    model_name, count = parse_accelerators(gpu)
    model_name = nodes.check_request_fits(session, catalog, model_name, count)
    entry = catalog.get(model_name)
    templates.check_fits(session, owner.id, template, entry.name, count)
    plans.check_plan(plan)
    if auto_renew and plan != plans.DAILY:
        raise InvalidInput("auto-renew applies to the daily plan only; add --plan daily")
    if start_when_cheap and not offpeak.list_windows(session):
        raise InvalidInput(
            "there are no off-peak windows on this server, so 'start when cheap' would wait "
            "forever; leave it out"
        )
    team_id = teams.team_for_member(session, owner, team)[0].id if team else None
    if name is not None:
        if not NAME_RE.match(name):
            raise InvalidInput(
                f"{name!r} is not a valid instance name: use lowercase letters, digits and '-', "
                "starting with a letter"
            )
        if session.scalar(
            select(Instance.id).where(
                Instance.owner_id == owner.id, Instance.name == name, Instance.status != RELEASED
            )
        ):
            raise Conflict(f"you already have an instance named {name!r}")
    now = utcnow()
    instance = Instance(
        owner_id=owner.id,
        name=name or f"tmp-{now.strftime('%H%M%S%f')}",
        gpu_model=entry.name,
        gpu_count=count,
        template=template,
        hourly_micro=plans.hourly_rate(entry, count, plan),
        plan=plan,
        team_id=team_id,
        start_when_cheap=start_when_cheap,
        auto_renew=auto_renew,
        status=QUEUED,
        desired_state="running",
        auto_release=auto_release,
        awaiting_workdir=awaiting_workdir,
        status_message="waiting for the workdir upload" if awaiting_workdir else "",
        queued_at=now,
        created_at=now,
        updated_at=now,
    )
    check_can_start(session, catalog, instance, min_start_minutes)
    session.add(instance)
    session.flush()
    if name is None:
        seq = session.scalar(select(func.count(Instance.id)).where(Instance.owner_id == owner.id))
        instance.name = f"{entry.name.lower()}-{seq}-{instance.id}"
    instance.workspace = str(workspaces / str(instance.id))
    session.flush()
    return instance


def get_instance(session: Session, owner: User, ref: str | int) -> Instance:
    """An instance of owner's by id or name. Someone else's is simply not found."""
    text = str(ref)
    query = select(Instance).where(Instance.owner_id == owner.id)
    if text.isascii() and text.isdigit():
        query = query.where(Instance.id == (parse_id(text) or 0))
    else:
        query = query.where(Instance.name == text).order_by(Instance.id.desc())
    instance = session.scalars(query).first()
    if instance is None:
        raise NotFound(f"you have no instance {text!r}; see `gpulease instance ls`")
    return instance


def list_instances(
    session: Session, owner: User, *, include_released: bool = False
) -> list[Instance]:
    query = select(Instance).where(Instance.owner_id == owner.id).order_by(Instance.id)
    if not include_released:
        query = query.where(Instance.status != RELEASED)
    return list(session.scalars(query))


def current_queue(session: Session) -> list[Request]:
    rows = session.scalars(
        select(Instance)
        .where(
            Instance.status == QUEUED,
            Instance.awaiting_workdir.is_(False),
            # a daily instance with a live reservation starts on its own GPUs, outside the queue
            or_(Instance.reserved_until.is_(None), Instance.reserved_until <= utcnow()),
            # a multi-node run queues as its rank 0 (services/instances/gangs.py)
            or_(Instance.gang_rank.is_(None), Instance.gang_rank == 0),
        )
        .order_by(Instance.queued_at, Instance.id)
    )
    return [Request(i.id, i.gpu_model, i.gpu_count) for i in rows]


def queue_position_map(session: Session) -> dict[int, int]:
    """Each queued instance's place among those for its GPU model, in the scheduler's order
    (services/instances/queue.py); its status message says why it waits and until when."""
    return queue.queue_positions(session, current_queue(session))


def stop_instance(
    session: Session, instance: Instance, reason: str = "stopped by its owner"
) -> None:
    """Ask for a stop. Queued: stopped at once. Live: the runner is told to stop; the GPUs
    are freed and billing ends when it has. Stopping a stopped instance is a no-op."""
    if instance.status in (STOPPED, FAILED, STOPPING):
        if instance.desired_state == "running":
            instance.desired_state = "stopped"
        return
    if instance.status == RELEASED:
        raise Conflict(f"instance {instance.name} was released; it cannot be stopped")
    instance.desired_state = "stopped"
    if instance.status == QUEUED:
        switch_status(session, instance, STOPPED, reason)
    elif instance.status in (STARTING, RUNNING):
        switch_status(session, instance, STOPPING, reason)


def start_instance(
    session: Session,
    instance: Instance,
    *,
    catalog: Catalog,
    min_start_minutes: int,
    no_gpu: bool = False,
) -> None:
    """Queue a stopped instance again; no_gpu starts it CPU only (resize.start_without_gpu)."""
    if no_gpu:
        resize.start_without_gpu(session, catalog, instance)
    else:
        resize.restore_gpus(session, catalog, instance)
    if instance.status in (QUEUED, STARTING, RUNNING):
        return
    if instance.status == STOPPING:
        raise Conflict(f"instance {instance.name} is still stopping; start it once it is stopped")
    if instance.status == RELEASED:
        raise Conflict(f"instance {instance.name} was released; create a new one")
    nodes.check_request_fits(session, catalog, instance.gpu_model, instance.gpu_count)
    templates.check_fits(
        session, instance.owner_id, instance.template, instance.gpu_model, instance.gpu_count
    )
    check_can_start(session, catalog, instance, min_start_minutes)
    instance.desired_state = "running"
    switch_status(session, instance, QUEUED, "started by its owner")


def release_instance(session: Session, instance: Instance) -> None:
    """Ask for a release: stop first if live; the workspace is deleted when it is stopped."""
    if instance.status == RELEASED:
        return
    instance.desired_state = "released"
    if instance.status in (QUEUED, STOPPED, FAILED):
        finish_release(session, instance)
    elif instance.status in (STARTING, RUNNING):
        switch_status(session, instance, STOPPING, "released by its owner")


def finish_release(session: Session, instance: Instance) -> None:
    switch_status(session, instance, RELEASED, instance.status_reason or "released")
    for path in (instance.workspace, instance.workdir_upload):
        if path:
            shutil.rmtree(path, ignore_errors=True) if Path(path).is_dir() else Path(path).unlink(
                missing_ok=True
            )
