"""Scheduled start and stop of instances: cron expressions read in the owner's time zone.

Cron times are wall-clock times in the schedule's zone. A time that does not exist there
(the hour skipped when clocks go forward) fires right after the jump; a time that happens
twice (clocks go back) fires once, at its first occurrence. The next fire time is stored
and computed from the fire being applied (or from now, when the server was down past
several), in the same transaction that applies it: a restart neither loses a due fire (it
fires late, once) nor repeats one.
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog
from gpulease.core.errors import GpuleaseError, InvalidInput
from gpulease.server.orm import Instance, InstanceSchedule, User
from gpulease.server.services import notifications
from gpulease.server.services.instances import lifecycle
from gpulease.server.services.instances.states import ACTIVE, RELEASED, RESTARTABLE
from gpulease.server.services.rows import find_all, get_owned, insert

ACTIONS = ("start", "stop")
MAX_PER_INSTANCE = 20
CRON_EXAMPLE = '"0 9 * * 1-5" (09:00 on weekdays)'


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`, or a refusal that says what is expected."""
    try:
        if not name or name != name.strip():
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(
            f"{name!r} is not a time zone: use an IANA name such as Europe/Berlin, "
            "America/New_York, Asia/Shanghai or UTC"
        ) from None


def check_cron(expr: str) -> str:
    """A five-field cron expression, normalised to single spaces."""
    fields = expr.split()
    if len(fields) != 5 or not croniter.is_valid(" ".join(fields)):
        raise InvalidInput(
            f"{expr!r} is not a cron expression: write five fields, minute hour "
            f"day-of-month month day-of-week, e.g. {CRON_EXAMPLE}"
        )
    normal = " ".join(fields)
    try:  # '0 0 31 2 *' is valid cron that names no date that exists
        croniter(normal, datetime(2000, 1, 1)).get_next(datetime)
    except CroniterBadDateError:
        raise InvalidInput(
            f"{expr!r} names no date that exists (such as 31 February); e.g. {CRON_EXAMPLE}"
        ) from None
    return normal


def next_fire(cron: str, zone_name: str, after: datetime) -> datetime:
    """The first time strictly after `after` (UTC) that `cron` names in zone_name."""
    tz = zone(zone_name)
    local = after.astimezone(tz).replace(tzinfo=None)
    times = croniter(cron, local)
    while True:
        wall = times.get_next(datetime)
        moment = wall.replace(tzinfo=tz).astimezone(UTC)  # fold=0: the first of two, or after a gap
        if moment > after:
            return moment


def add_schedule(
    session: Session,
    owner: User,
    instance: Instance,
    *,
    action: str,
    cron: str,
    timezone: str | None,
    now: datetime,
) -> InstanceSchedule:
    if action not in ACTIONS:
        raise InvalidInput(f"action {action!r} is neither start nor stop; give one of them")
    if instance.status == RELEASED:
        raise InvalidInput(f"instance {instance.name} was released; it cannot be scheduled")
    expr = check_cron(cron)
    zone_name = timezone if timezone is not None else owner.timezone
    zone(zone_name)
    count = len(list_schedules(session, instance))
    if count >= MAX_PER_INSTANCE:
        raise InvalidInput(
            f"an instance may have at most {MAX_PER_INSTANCE} schedules; remove one first"
        )
    schedule = InstanceSchedule(
        instance_id=instance.id,
        action=action,
        cron=expr,
        timezone=zone_name,
        next_fire_at=next_fire(expr, zone_name, now),
        created_at=now,
    )
    return insert(session, schedule)


def list_schedules(session: Session, instance: Instance) -> list[InstanceSchedule]:
    return find_all(session, InstanceSchedule, InstanceSchedule.instance_id == instance.id)


def remove_schedule(session: Session, instance: Instance, schedule_id: int) -> None:
    schedule = get_owned(
        session,
        InstanceSchedule,
        schedule_id,
        f"instance {instance.name} has no schedule {schedule_id}; "
        f"see `gpulease instance schedule ls {instance.name}`",
        instance_id=instance.id,
    )
    session.delete(schedule)
    session.flush()


def set_user_timezone(session: Session, user: User, name: str, now: datetime) -> None:
    """Change the user's zone; their schedules that followed the old zone follow the new."""
    zone(name)
    old = user.timezone
    user.timezone = name
    if old == name:
        return
    for schedule in session.scalars(
        select(InstanceSchedule)
        .join(Instance, Instance.id == InstanceSchedule.instance_id)
        .where(Instance.owner_id == user.id, InstanceSchedule.timezone == old)
    ):
        schedule.timezone = name
        schedule.next_fire_at = next_fire(schedule.cron, name, now)


def fire(
    session: Session,
    catalog: Catalog,
    schedule: InstanceSchedule,
    now: datetime,
    *,
    min_start_minutes: int,
) -> None:
    """Apply one due fire and move the schedule to its next time. A start that cannot
    happen (no credit, say) is reported to the owner, and the schedule still moves on."""
    instance = session.get(Instance, schedule.instance_id)
    if instance is None or instance.status == RELEASED:
        session.delete(schedule)
        return
    what = f"schedule {schedule.id} ({schedule.action} at {schedule.cron!r}, {schedule.timezone})"
    if schedule.action == "start" and instance.status in RESTARTABLE:
        try:
            with session.begin_nested():
                lifecycle.start_instance(
                    session, instance, catalog=catalog, min_start_minutes=min_start_minutes
                )
                instance.status_reason = f"started by its {what}"
        except GpuleaseError as exc:
            notifications.notify(
                session,
                instance.owner_id,
                "schedule_failed",
                f"instance {instance.name}: the scheduled start did not happen: {exc.message}",
            )
    elif schedule.action == "stop" and instance.status in ACTIVE:
        lifecycle.stop_instance(session, instance, f"stopped by its {what}; workspace kept")
    schedule.last_fired_at = schedule.next_fire_at
    schedule.next_fire_at = next_fire(
        schedule.cron, schedule.timezone, max(schedule.next_fire_at, now)
    )
