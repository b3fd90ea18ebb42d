"""Billing chores: daily blocks ending, storage metering, budgets, low-balance warnings, and
releasing instances stopped for too long (with notices before)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.errors import PaymentRequired
from gpulease.core.money import format_credits
from gpulease.server.db import batches, finds_any, readers, transaction, utcnow
from gpulease.server.orm import DatasetUsage, Instance, StorageMeter
from gpulease.server.runtime import Runtime
from gpulease.server.services import ledger, notifications
from gpulease.server.services.billing import limits, plans, storage
from gpulease.server.services.instances.lifecycle import release_instance, stop_instance
from gpulease.server.services.instances.states import (
    ACTIVE,
    FAILED,
    QUEUED,
    RELEASED,
    RUNNING,
    STARTING,
    STOPPED,
    free_gpus,
)


def tick(rt: Runtime) -> None:
    daily_blocks(rt)
    budgets(rt)
    release_stopped(rt)


def daily_blocks(rt: Runtime) -> None:
    """Renew or end the daily blocks that ended by now. Asks first in a read-only
    transaction (no SQLite write lock): on most ticks no block ends."""
    now = utcnow()
    ended_by_now = select(Instance).where(
        Instance.plan == plans.DAILY,
        Instance.reserved_until <= now,
        Instance.status != RELEASED,
    )
    if not finds_any(rt.sessions, ended_by_now.with_only_columns(Instance.id)):
        return
    with transaction(rt.sessions) as session:
        ended = session.scalars(ended_by_now).all()
        for instance in ended:
            if instance.status in (STARTING, RUNNING) and instance.auto_renew:
                try:
                    plans.buy_block(session, instance, rt.catalog, now)
                    continue
                except PaymentRequired as exc:
                    reason = f"its daily block ended and could not renew: {exc.message}"
            else:
                reason = "its daily block ended; start it again for a new block"
            instance.reserved_until = None
            if instance.status in (STARTING, RUNNING):
                stop_instance(session, instance, reason)
                notifications.notify_once(
                    session,
                    instance.owner_id,
                    "daily_block_ended",
                    f"daily-end:{instance.id}:{instance.daily_blocks}",
                    f"instance {instance.name}: {reason}",
                )
            elif instance.status in (STOPPED, FAILED, QUEUED):
                free_gpus(session, instance)


def budgets(rt: Runtime) -> None:
    """Stop live instances of wallets whose monthly budget or member limit is spent, and
    warn owners whose balance runs low."""
    now = utcnow()
    # Read first, without the write lock: on most ticks no wallet is over or low.
    with transaction(readers(rt.sessions)) as session:
        if not _budgets(session, rt, now, act=False):
            return
    with transaction(rt.sessions) as session:
        _budgets(session, rt, now, act=True)


def _budgets(session: Session, rt: Runtime, now: datetime, *, act: bool) -> bool:
    """Whether a wallet is over its budget or an owner's balance is low; with act, stop
    the wallet's live instances and send the notices."""
    symbol = rt.catalog.currency_symbol
    found = False
    live = session.scalars(select(Instance).where(Instance.status.in_(ACTIVE))).all()
    wallets = {(i.owner_id, i.team_id) for i in live}
    for owner_id, team_id in sorted(wallets, key=lambda w: (w[0], w[1] or 0)):
        reason = limits.over_budget(session, owner_id, team_id, now)
        if reason:
            if not act:
                return True
            found = True
            for instance in live:
                if (instance.owner_id, instance.team_id) == (owner_id, team_id):
                    stop_instance(session, instance, f"stopped: {reason}; workspace kept")
            notifications.notify_once(
                session,
                owner_id,
                "budget_reached",
                f"budget:{owner_id}:{team_id}:{now:%Y-%m}",
                f"{reason}: your instances on that wallet were stopped (workspaces kept)",
            )
    for owner_id in sorted({w[0] for w in wallets if w[1] is None}):
        spend = limits.hourly_spend(session, owner_id)
        threshold = limits.caps_of(session, owner_id).low_balance_micro
        if threshold is None:
            threshold = spend * rt.settings.low_balance_minutes // 60
        balance = ledger.balance(session, owner_id)
        if spend > 0 and 0 < balance < threshold:
            if not act:
                return True
            found = True
            left = int(balance * 60 / spend)
            notifications.notify_once(
                session,
                owner_id,
                "low_balance",
                f"low-balance:{owner_id}:{now:%Y-%m-%d}",
                f"low balance: {format_credits(balance, symbol)} left, about {left} min at "
                f"your current {format_credits(spend, symbol)}/h; instances stop at zero",
            )
    return found


def release_stopped(rt: Runtime) -> None:
    now = utcnow()
    keep = timedelta(days=rt.settings.stopped_release_days)
    stopped = select(Instance).where(Instance.status.in_((STOPPED, FAILED)))
    # Read first, without the write lock: most stopped instances are days from their first
    # warning, and the write transaction below is only for those that are not.
    first_warning = timedelta(days=max(rt.settings.release_warnings, default=0))
    with transaction(readers(rt.sessions)) as session:
        due = [
            i.id
            for i in session.scalars(stopped)
            if i.stopped_at is not None and now >= i.stopped_at + keep - first_warning
        ]
    if not due:
        return
    with transaction(rt.sessions) as session:
        taken = [
            instance
            for batch in batches(due)
            for instance in session.scalars(stopped.where(Instance.id.in_(batch))).all()
        ]
        for instance in taken:
            if instance.stopped_at is None or plans.holds_reservation(instance, now):
                continue
            release_at = instance.stopped_at + keep
            if now >= release_at:
                release_instance(session, instance)
                notifications.notify_once(
                    session,
                    instance.owner_id,
                    "instance_released",
                    f"auto-release:{instance.id}:{instance.stopped_at.isoformat()}",
                    f"instance {instance.name} was released after "
                    f"{rt.settings.stopped_release_days} days stopped; its workspace is deleted",
                )
                continue
            for days in rt.settings.release_warnings:
                if now >= release_at - timedelta(days=days):
                    notifications.notify_once(
                        session,
                        instance.owner_id,
                        "release_warning",
                        f"release-warning:{instance.id}:{instance.stopped_at.isoformat()}:{days}",
                        f"instance {instance.name} has been stopped since "
                        f"{instance.stopped_at:%Y-%m-%d}; it will be released (workspace "
                        f"deleted) on {release_at:%Y-%m-%d %H:%M} UTC unless you start it",
                    )
                    break


def storage_tick(rt: Runtime) -> None:
    """Measure every kept workspace, and each user's dataset storage, and bill it since the
    last measurement."""
    workspace_storage(rt)
    dataset_storage(rt)


def dataset_storage(rt: Runtime) -> None:
    """A user's datasets are billed as one meter (kind 'datasets', ref = the user) on the
    bytes they store, each deduplicated chunk once, as the quota counts them."""
    now = utcnow()
    price = rt.settings.storage_price_micro
    with transaction(rt.sessions) as session:
        stored = {u.owner_id: u.bytes for u in session.scalars(select(DatasetUsage))}
        metered = set(
            session.scalars(
                select(StorageMeter.ref_id).where(
                    StorageMeter.kind == "datasets", StorageMeter.closed_at.is_(None)
                )
            )
        )
        for owner_id in sorted(set(stored) | metered):
            kib = -(-max(stored.get(owner_id, 0), 0) // 1024)
            _measured(session, "datasets", owner_id, owner_id, None, kib, price, now)


def workspace_storage(rt: Runtime) -> None:
    """Measure every kept workspace and bill its storage since the last measurement. On a
    backend whose runners live on other nodes the server's disk holds no workspace: there
    it is the size of the copy its runner saved at its last stop (services/workspaces.py)."""
    now = utcnow()
    price = rt.settings.storage_price_micro
    on_disk = rt.backend.same_host
    with transaction(readers(rt.sessions)) as session:  # measured outside any transaction
        rows = [
            (i.id, i.owner_id, i.team_id, i.workspace, i.status, i.workspace_snapshot_bytes)
            for i in session.scalars(select(Instance).where(Instance.workspace.is_not(None)))
        ]
        open_meters = {
            m.ref_id: m
            for m in session.scalars(
                select(StorageMeter).where(
                    StorageMeter.kind == "workspace", StorageMeter.closed_at.is_(None)
                )
            )
        }
    sizes = {
        instance_id: storage.tree_kib(Path(workspace)) if on_disk else -(-saved // 1024)
        for instance_id, _, _, workspace, status, saved in rows
        if workspace and status != RELEASED
    }
    with transaction(rt.sessions) as session:
        for instance_id, owner_id, team_id, _, status, _ in rows:
            if status == RELEASED:
                meter = open_meters.get(instance_id)
                if meter is not None:
                    meter = session.merge(meter)
                    storage.record(session, meter, 0, now, close=True)
                continue
            kib = sizes.get(instance_id, 0)
            _measured(session, "workspace", instance_id, owner_id, team_id, kib, price, now)


def _measured(
    session: Session,
    kind: str,
    ref_id: int,
    owner_id: int,
    team_id: int | None,
    kib: int,
    price_micro: int,
    now: datetime,
) -> None:
    """Record a measurement of kib on the open meter of (kind, ref_id), opening one first
    when there is none, and bill it since the last measurement."""
    meter = storage.meter_for(
        session,
        kind=kind,
        ref_id=ref_id,
        owner_id=owner_id,
        team_id=team_id,
        price_micro=price_micro,
        now=now,
    )
    storage.record(session, meter, kib, now)
