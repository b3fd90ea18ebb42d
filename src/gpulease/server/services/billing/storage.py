"""Storage billing: workspaces (and datasets) cost a price per GiB per day, also while an
instance is stopped. Each stored thing has a StorageMeter that accumulates KiB-seconds from
periodic measurements and is charged the difference to floor(KiB-s × price / GiB-day)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpulease.server.orm import StorageMeter
from gpulease.server.services import ledger
from gpulease.server.services.rows import insert

KIB_PER_GIB = 1024 * 1024
SECONDS_PER_DAY = 86_400


def tree_kib(path: Path) -> int:
    """Disk space a directory tree takes, in KiB (allocated blocks; links not followed).
    A workspace is its jobs' to change while it is measured: the tree is walked through
    directory descriptors (os.fwalk), so a directory swapped for a link is not entered."""
    total = 0
    try:
        for _, dirs, files, dir_fd in os.fwalk(path, follow_symlinks=False):
            for name in dirs + files:
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
    except (FileNotFoundError, NotADirectoryError):
        return 0  # no workspace here (not made yet, released, or on another node): nothing
    return -(-total // 1024)


def meter_for(
    session: Session,
    *,
    kind: str,
    ref_id: int,
    owner_id: int,
    team_id: int | None,
    price_micro: int,
    now: datetime,
) -> StorageMeter:
    meter = session.scalar(
        select(StorageMeter).where(StorageMeter.kind == kind, StorageMeter.ref_id == ref_id)
    )
    if meter is None:
        meter = StorageMeter(
            owner_id=owner_id,
            team_id=team_id,
            kind=kind,
            ref_id=ref_id,
            kib=0,
            kib_seconds=0,
            charged_micro=0,
            price_micro_per_gb_day=price_micro,
            measured_at=now,
        )
        insert(session, meter)
    return meter


def due(meter: StorageMeter, kib_seconds: int) -> int:
    return kib_seconds * meter.price_micro_per_gb_day // (KIB_PER_GIB * SECONDS_PER_DAY)


def record(
    session: Session, meter: StorageMeter, kib_now: int, now: datetime, *, close: bool = False
) -> int:
    """Bill the time since the last measurement at the size measured then, then remember
    the new size. Returns the amount charged now."""
    elapsed = int((now - meter.measured_at).total_seconds())
    if elapsed <= 0 and not close:
        meter.kib = kib_now
        return 0
    elapsed = max(elapsed, 0)
    kib_seconds = meter.kib_seconds + meter.kib * elapsed
    total = due(meter, kib_seconds)
    amount = total - meter.charged_micro
    moved = session.execute(
        update(StorageMeter)
        .where(StorageMeter.id == meter.id, StorageMeter.kib_seconds == meter.kib_seconds)
        .values(
            kib_seconds=kib_seconds,
            charged_micro=total,
            kib=kib_now,
            # whole seconds only: the fraction is billed with the next measurement
            measured_at=meter.measured_at + timedelta(seconds=elapsed),
            closed_at=now if close else None,
        )
        .execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]
    if moved != 1:
        session.refresh(meter)  # another replica measured it meanwhile
        return 0
    if amount > 0:
        ledger.charge(
            session,
            meter.owner_id,
            amount,
            key=f"storage:{meter.id}:{kib_seconds}",
            memo=f"{meter.kind} storage ({meter.kind} {meter.ref_id}), {meter.kib} KiB for "
            f"{elapsed} s",
            kind="storage",
            team_id=meter.team_id,
            instance_id=meter.ref_id if meter.kind == "workspace" else None,
            at=now,
        )
    session.refresh(meter)
    return amount
