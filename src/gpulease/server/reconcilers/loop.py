"""The reconciler loop: every tick, schedule, launch/stop, check health, meter."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpulease.server.reconcilers import (
    billing,
    fleet,
    health,
    idle,
    launcher,
    local_node,
    meter,
    notify,
    scheduler,
    sweeps,
)
from gpulease.server.reconcilers import schedules as schedule_fires
from gpulease.server.reconcilers.gpu_samples import (
    PRUNE_INTERVAL_S,
    SAMPLE_INTERVAL_S,
    prune_samples,
    sample_gpus,
)
from gpulease.server.runtime import Runtime

log = logging.getLogger("gpulease.reconcilers")
Step = Callable[[Runtime], object]


def steps(rt: Runtime) -> list[tuple[Step, float]]:
    """Each step with the least time between two runs of it (0: every tick)."""
    return [
        (schedule_fires.tick, 0),  # first: a scheduled start queues in time for this placement
        (scheduler.tick, 0),
        (launcher.tick, 0),
        (fleet.tick, 0),  # a fleet backend's nodes; before health, which it explains
        (local_node.tick, 5),  # the local node's last-seen time
        (health.tick, 0),
        (idle.tick, 5),  # idle stop and maximum runtime; every 5 s is soon enough
        (sweeps.tick, 2),  # sweep trials the median stopping rule finds behind
        (meter.tick, 0),
        (billing.tick, 5),
        (billing.storage_tick, rt.settings.storage_meter_interval_s),
        (sample_gpus, SAMPLE_INTERVAL_S),  # GPU samples of this host's real GPUs
        (prune_samples, PRUNE_INTERVAL_S),  # GPU samples past their retention
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
        # Webhook and email sends run beside the loop: a slow receiver never holds it up.
        self.deliveries = notify.DeliveryThread(rt)

    def run(self) -> None:
        self.deliveries.start()
        try:
            health.tick(self.rt, check_all=True)  # reattach: fail runners that died meanwhile
        except Exception:
            log.exception("start-up health check failed")
        last_run: dict[Step, float] = {}
        while not self.stopping.is_set():
            run_once(self.rt, last_run)
            self.wake.wait(self.rt.settings.tick_interval_s)
            self.wake.clear()
        self.deliveries.join(timeout=self.rt.settings.notify_timeout_s)

    def stop(self) -> None:
        self.deliveries.stop()
        self.stopping.set()
        self.wake.set()
