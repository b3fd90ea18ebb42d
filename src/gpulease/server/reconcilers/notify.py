"""Send due notification deliveries (webhook, email): claim under a lease in one transaction,
send outside any transaction, record each outcome in another, guarded by the lease."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from gpulease.server.db import finds_any, transaction, utcnow
from gpulease.server.runtime import Runtime
from gpulease.server.services import notification_delivery

log = logging.getLogger("gpulease.notify")
SENDERS = 8


def tick(rt: Runtime, now: datetime | None = None) -> int:
    """Send what is due at `now` (tests pass a later time instead of waiting out a backoff);
    returns how many were delivered. Up to SENDERS go out in parallel."""
    settings = rt.settings
    now = now or utcnow()
    if not finds_any(rt.sessions, notification_delivery.due_ids(now)):
        return 0
    with transaction(rt.sessions) as session:
        jobs = notification_delivery.claim(session, settings, now)
    if not jobs:
        return 0
    if len(jobs) == 1:
        outcomes = [notification_delivery.send(jobs[0], settings)]
    else:
        with ThreadPoolExecutor(max_workers=min(SENDERS, len(jobs))) as pool:
            outcomes = list(pool.map(lambda job: notification_delivery.send(job, settings), jobs))
    delivered = 0
    with transaction(rt.sessions) as session:
        now = max(now, utcnow())
        for job, error in zip(jobs, outcomes, strict=True):
            kept = notification_delivery.record(
                session, job, error, now, settings.notify_max_attempts
            )
            delivered += int(kept and error is None)
    return delivered


class DeliveryThread(threading.Thread):
    """Runs `tick` every tick interval beside the reconciler loop (which starts and stops
    it), so that a slow webhook or mail server delays only other notifications."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__(name="gpulease-notify", daemon=True)
        self.rt = rt
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                while tick(self.rt) and not self.stopping.is_set():
                    pass  # more may be due right away
            except Exception:  # a bad batch must not end deliveries for good
                log.exception("notification delivery failed")
            self.stopping.wait(self.rt.settings.tick_interval_s)

    def stop(self) -> None:
        self.stopping.set()
