"""The reconciler loop: every tick, schedule, launch/stop, check health, meter."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpulease.server.reconcilers import billing, health, launcher, meter, scheduler
from gpulease.server.runtime import Runtime

log = logging.getLogger("gpulease.reconcilers")
Step = Callable[[Runtime], object]


def steps(rt: Runtime) -> list[tuple[Step, float]]:
    """Each step with the least time between two runs of it (0: every tick)."""
    return [
        (scheduler.tick, 0),
        (launcher.tick, 0),
        (health.tick, 0),
        (meter.tick, 0),
        (billing.tick, 5),
        (billing.storage_tick, rt.settings.storage_meter_interval_s),
    ]


def run_once(rt: Runtime, last_run: dict[Step, float] | None = None) -> None:
    """Run every step that is due. Without last_run (tests), every step runs."""
    now = time.monotonic()
    for step, interval in steps(rt):
        if last_run is not None:
            if now - last_run.get(step, float("-inf")) < interval:
                continue
            last_run[step] = now
        try:
            step(rt)
        except Exception:  # one failing step must not stop the others or the loop
            log.exception("reconciler step %s failed", getattr(step, "__qualname__", step))


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
        last_run: dict[Step, float] = {}
        while not self.stopping.is_set():
            run_once(self.rt, last_run)
            self.wake.wait(self.rt.settings.tick_interval_s)
            self.wake.clear()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
