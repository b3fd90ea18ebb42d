"""Stop latency: from the `gpulease instance stop` request to its runner acting on it.

Measured against a real server, SDK and runner on this host (SQLite, the local backend, the
`python` template, already built, the default 2 s heartbeat): the stop reaches the runner
through its /commands long poll. Beside it, the baseline: before the long poll carried stops,
the runner learnt of one at its next heartbeat, on average half an interval later. Median of
N stops (default 20); the instance is started again between them.

    .venv/bin/python benchmarks/stop_latency.py [-n 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from results import emit
from temp_platform import sqlite_platform

from stop_support import stop_latency  # noqa: E402

HEARTBEAT_S = 2.0  # the server's default heartbeat_interval_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        platform = sqlite_platform(
            root, "T4:1", {"GPULEASE_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S)}
        )
        platform.start()
        samples: list[float] = []
        try:
            platform.cli(
                "register", "--server", platform.url, "--name", "bench", "--password", "pw-123456"
            )
            platform.cli(
                "instance", "create", "--gpu", "T4:1", "--template", "python", "--name", "box",
                "--wait",
            )  # fmt: skip
            for i in range(args.n):
                if i:
                    platform.cli("instance", "start", "box")
                    platform.wait_status("box", "running")
                took, _ = stop_latency(platform, "box")
                samples.append(took)
                platform.wait_status("box", "stopped")
                print(f"stop {i + 1}/{args.n}: {took * 1000:.0f} ms", flush=True)
        finally:
            platform.end_runners()
            platform.stop()
    median = statistics.median(samples)
    print(f"stop -> runner acts, median of {args.n}: {median * 1000:.0f} ms")
    print(f"  (min {min(samples) * 1000:.0f} ms, max {max(samples) * 1000:.0f} ms)")
    print(
        f"baseline, stop at the next heartbeat ({HEARTBEAT_S:.0f} s interval): "
        f"median {HEARTBEAT_S / 2 * 1000:.0f} ms, up to {HEARTBEAT_S * 1000:.0f} ms"
    )
    emit(
        "`gpulease instance stop` → the runner acts",
        f"{median * 1000:.0f} ms",
        f"next heartbeat, {HEARTBEAT_S / 2 * 1000:.0f} ms on average",
        f"{median / (HEARTBEAT_S / 2):.2f}× the heartbeat wait",
        "<= 100 ms",
        median <= 0.1,
    )


if __name__ == "__main__":
    main()
