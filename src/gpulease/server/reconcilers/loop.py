"""The reconciler loop: every tick, schedule, launch/stop, check health, meter."""

from __future__ import annotations

import logging
import threading

from gpulease.server.reconcilers import health, launcher, meter, scheduler
from gpulease.server.runtime import Runtime

log = logging.getLogger("gpulease.reconcilers")


def run_once(rt: Runtime) -> None:
    for step in (scheduler.tick, launcher.tick, health.tick, meter.tick):
        try:
            step(rt)
        except Exception:  # one failing step must not stop the others or the loop
            log.exception("reconciler step %s failed", step.__module__)


class ReconcilerThread(threading.Thread):
    def __init__(self, rt: Runtime) -> None:
        super().__init__(name="gpulease-reconcilers", daemon=True)
        self.rt = rt
        self.stopping = threading.Event()
        self.wake = threading.Event()

    def run(self) -> None:
        try:
            health.tick(self.rt, check_all=True)  # reattach: fail runners that died meanwhile
        except Exception:
            log.exception("start-up health check failed")
        while not self.stopping.is_set():
            run_once(self.rt)
            self.wake.wait(self.rt.settings.tick_interval_s)
            self.wake.clear()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
