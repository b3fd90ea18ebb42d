"""What renters ask of instances: create, list, show, stop, start, release.

A rank of a multi-node run (services/instances/gangs.py) is useless without the others, so
stop, start and release act on its whole gang, whichever rank they are asked of.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog, parse_accelerators
from gpulease.core.errors import Conflict, InvalidInput, NotFound, PaymentRequired, Unavailable
from gpulease.core.ids import parse_id
from gpulease.core.money import cost_for_seconds, format_credits
from gpulease.scheduler.fifo import Request
from gpulease.server.db import utcnow
from gpulease.server.orm import Gpu, Instance, Node, User
from gpulease.server.services import ledger, nodes, templates
from gpulease.server.services.billing import limits, offpeak, plans, teams
from gpulease.server.services.instances import queue, resize
from gpulease.server.services.instances.states import (
    ACTIVE,
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
    session: Session, catalog: Catalog, instance: Instance, min_minutes: int, *, ranks: int = 1
) -> None:
    """Refuse a start the wallet cannot pay for or that would break a spending cap; `ranks`
    instances like this one start together (a multi-node run)."""
    symbol = catalog.currency_symbol
    needed = upfront_cost(catalog, instance, min_minutes) * ranks
    hourly = instance.hourly_micro * ranks
    balance = ledger.balance(session, instance.owner_id, instance.team_id)
    wallet = "the team's balance" if instance.team_id else "your balance"
    if needed and (balance <= 0 or balance < needed):
        what = (
            "a daily block costs"
            if instance.plan == plans.DAILY
            else f"{'this instance' if ranks == 1 else f'this run of {ranks} nodes'} costs "
            f"{format_credits(hourly, symbol)}/h and needs for its first {min_minutes} minutes"
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
        hourly,
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


def gang_members(session: Session, gang_id: int) -> list[Instance]:
    """A multi-node run's instances in rank order."""
    return list(
        session.scalars(
            select(Instance).where(Instance.gang_id == gang_id).order_by(Instance.gang_rank)
        )
    )


def _gang_of(session: Session, instance: Instance) -> list[Instance]:
    """The instance's whole multi-node run, or the instance alone."""
    return [instance] if instance.gang_id is None else gang_members(session, instance.gang_id)


def _as_one(reason: str, instance: Instance, what: str) -> str:
    """A rank's reason when another rank's stop or release took it along."""
    return f"{reason} (with rank {instance.gang_rank} of its multi-node run, which {what})"[:500]


def stop_instance(
    session: Session, instance: Instance, reason: str = "stopped by its owner"
) -> None:
    """Ask for a stop. Queued: stopped at once. Live: the runner is told to stop; the GPUs
    are freed and billing ends when it has. Stopping a stopped instance is a no-op. A rank
    of a multi-node run stops with every other rank of it, each told why (a run missing a
    rank is useless: torchrun would wait for it)."""
    if instance.status == RELEASED:
        raise Conflict(f"instance {instance.name} was released; it cannot be stopped")
    stop_one(session, instance, reason)
    for member in _gang_of(session, instance):
        if member.id != instance.id and member.status != RELEASED:
            stop_one(session, member, _as_one(reason, instance, "stops as one"))


def stop_one(session: Session, instance: Instance, reason: str) -> None:
    """stop_instance for this instance only, whatever its gang (gangs.stop_broken stops the
    rest of a gang with a reason of its own)."""
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
    """Queue a stopped instance again; no_gpu starts it CPU only (resize.start_without_gpu).
    A rank of a multi-node run queues its whole run again (_start_gang)."""
    if instance.gang_id is not None:
        _start_gang(
            session,
            instance,
            gang_members(session, instance.gang_id),
            catalog=catalog,
            min_start_minutes=min_start_minutes,
            no_gpu=no_gpu,
        )
        return
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


def _start_gang(
    session: Session,
    asked: Instance,
    gang: list[Instance],
    *,
    catalog: Catalog,
    min_start_minutes: int,
    no_gpu: bool,
) -> None:
    """Queue a stopped multi-node run again as the one request it was made as: rank 0 in
    the queue for all its nodes, the others waiting with it, placed all together or not at
    all on whichever nodes have the GPUs then (each rank's workspace moves with it when its
    node is another than before). Refused with what to do instead when it cannot start
    whole: a rank released, one still live or stopping, ranks no longer alike."""
    leader = gang[0]
    run = f"the multi-node run {leader.name}"
    if no_gpu:
        raise Conflict(
            f"instance {asked.name} is rank {asked.gang_rank} of {run}, whose ranks run "
            "with GPUs on every node; start it without --no-gpu, or create a one-node "
            "instance for CPU work"
        )
    released = [m for m in gang if m.status == RELEASED]
    if asked.status == RELEASED or len(released) == len(gang):
        raise Conflict(
            f"instance {asked.name} was released; create the run again (`gpulease run task.yaml`)"
        )
    if released:
        member = released[0]
        raise Conflict(
            f"rank {member.gang_rank} ({member.name}) of {run} was released, and the run "
            "cannot start without it; release the others and create the run again "
            "(`gpulease run task.yaml`)"
        )
    if len(gang) != (leader.gang_size or 0):
        raise Conflict(
            f"{run} has {len(gang)} of its {leader.gang_size} ranks and cannot start "
            "without the others; release it and create it again"
        )
    if all(m.status in ACTIVE for m in gang):
        return  # started already
    for member in gang:
        if member.status == STOPPING:
            raise Conflict(
                f"rank {member.gang_rank} ({member.name}) of {run} is still stopping; start "
                "the run once every rank has stopped"
            )
        if member.status in ACTIVE:
            raise Conflict(
                f"rank {member.gang_rank} ({member.name}) of {run} is still {member.status}, "
                "and a multi-node run starts only as a whole: stop it with `gpulease "
                f"instance stop {leader.name}` and start it again once every rank has stopped"
            )
    for member in gang:
        resize.restore_gpus(session, catalog, member)  # GPUs an older no-GPU start set aside
    shape = (leader.gpu_model, leader.gpu_count)
    for member in gang:
        if (member.gpu_model, member.gpu_count) != shape:
            raise Conflict(
                f"rank {member.gang_rank} ({member.name}) of {run} has {member.gpu_model} × "
                f"{member.gpu_count} and rank 0 {leader.gpu_model} × {leader.gpu_count}; the "
                "ranks of a multi-node run need the same GPUs: resize them alike with "
                "`gpulease instance resize`"
            )
    if leader.gpu_count < 1:
        raise Conflict(
            f"{run} has no GPUs and a multi-node run needs GPUs on each node: resize its "
            "ranks with `gpulease instance resize`"
        )
    nodes.check_request_fits(session, catalog, leader.gpu_model, leader.gpu_count)
    check_enough_nodes(session, leader.gpu_model, leader.gpu_count, len(gang))
    templates.check_fits(
        session, leader.owner_id, leader.template, leader.gpu_model, leader.gpu_count
    )
    check_can_start(session, catalog, leader, min_start_minutes, ranks=len(gang))
    for member in gang:
        member.desired_state = "running"
        member.fabric_address = None  # no rank is live: the gang gets addresses when placed
        switch_status(session, member, QUEUED, "started by its owner")
    for member in gang[1:]:
        member.status_message = waiting_with_leader(leader)


def waiting_with_leader(leader: Instance) -> str:
    """The status message of a queued rank other than 0: only rank 0 stands in the queue."""
    return (
        f"waits with its multi-node run: rank 0 ({leader.name}) stands in the queue for its "
        f"{leader.gang_size} nodes"
    )


def check_enough_nodes(session: Session, model: str, count: int, size: int) -> None:
    """Refuse a multi-node run that the ready nodes could never hold: `size` distinct nodes
    with `count` GPUs of `model` each."""
    per_node = (
        select(Gpu.node_id)
        .join(Node, Node.id == Gpu.node_id)
        .where(Gpu.model == model, Gpu.present.is_(True), Node.status == "ready")
        .group_by(Gpu.node_id)
        .having(func.count(Gpu.id) >= count)
        .subquery()
    )
    having = session.scalar(select(func.count()).select_from(per_node)) or 0
    if having < size:
        raise Unavailable(
            f"{size} nodes with {model} × {count} each are needed and {having} "
            f"{'has' if having == 1 else 'have'} that many; ask for num_nodes: {having} or "
            "fewer GPUs per node"
        )


def release_instance(session: Session, instance: Instance) -> None:
    """Ask for a release: stop first if live; the workspace is deleted when it is stopped.
    A rank of a multi-node run is released with every other rank of it (the run cannot
    start again without all of them)."""
    for member in _gang_of(session, instance):
        if member.id == instance.id:
            _release_one(session, member, "released by its owner")
        else:
            _release_one(session, member, _as_one("released by its owner", instance, "goes as one"))


def _release_one(session: Session, instance: Instance, reason: str) -> None:
    if instance.status == RELEASED:
        return
    instance.desired_state = "released"
    if instance.status in (QUEUED, STOPPED, FAILED):
        finish_release(session, instance)
    elif instance.status in (STARTING, RUNNING):
        switch_status(session, instance, STOPPING, reason)


def finish_release(session: Session, instance: Instance) -> None:
    switch_status(session, instance, RELEASED, instance.status_reason or "released")
    for path in (instance.workspace, instance.workdir_upload):
        if path:
            shutil.rmtree(path, ignore_errors=True) if Path(path).is_dir() else Path(path).unlink(
                missing_ok=True
            )
