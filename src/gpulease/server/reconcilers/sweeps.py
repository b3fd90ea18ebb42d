"""Stop the trials of sweeps that the median stopping rule finds behind (services/sweeps)."""

from __future__ import annotations

from datetime import datetime

from gpulease.server.db import readers, transaction, utcnow
from gpulease.server.orm import Sweep
from gpulease.server.runtime import Runtime
from gpulease.server.services import sweeps


def tick(rt: Runtime, now: datetime | None = None) -> int:
    """One pass over the sweeps that stop early and have trials running, each in its own
    short transaction: the stop is an intent (the launcher stops the runner), so nothing
    here leaves the database. Returns how many trials it stopped."""
    now = now or utcnow()
    with transaction(readers(rt.sessions)) as session:
        ids = sweeps.live_sweep_ids(session)
    stopped = 0
    for sweep_id in ids:
        with transaction(rt.sessions) as session:
            sweep = session.get(Sweep, sweep_id)
            if sweep is not None:
                stopped += len(sweeps.stop_behind(session, sweep, now))
    return stopped
