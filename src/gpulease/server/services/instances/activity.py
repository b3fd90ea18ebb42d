"""Terminal and notebook activity of instances, which keeps them from being stopped as idle."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import or_, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.util import identity_key

from gpulease.server.orm import Instance

# At most one write per instance in this long: typing in a terminal must not become a
# stream of UPDATEs; idle stop counts in minutes.
THROTTLE = timedelta(seconds=30)


def touch(session: Session, instance_id: int, now: datetime) -> bool:
    """Record activity in the instance (terminal input, a proxied Jupyter request) at `now`.

    One guarded UPDATE, skipped when the last recorded activity is under 30 s old; it also
    ends an idle warning, so the next idle period warns again. Returns whether it wrote.
    """
    result = session.execute(
        update(Instance)
        .where(
            Instance.id == instance_id,
            or_(Instance.last_activity_at.is_(None), Instance.last_activity_at <= now - THROTTLE),
        )
        .values(last_activity_at=now, idle_warned_at=None)
        .execution_options(synchronize_session=False)
    )
    written = bool(result.rowcount)  # type: ignore[attr-defined]
    if written:
        instance = session.identity_map.get(identity_key(Instance, instance_id))
        if isinstance(instance, Instance):
            session.expire(instance, ["last_activity_at", "idle_warned_at"])
    return written
