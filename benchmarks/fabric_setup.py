"""What the job fabric adds to a rank's start: an instance network made and closed
(namespace, rules, slirp4netns) with a fabric interface (a macvlan of a veth parent, moved
in, addressed, up, and the fabric rules) beside the same network without one, in turns in
the same run; medians in milliseconds. As root, on a host where instance networks work.

    .venv/bin/python benchmarks/fabric_setup.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import temp_platform  # noqa: F401  (puts tests/ on sys.path)
from results import emit

from fabric_support import PARENT, PREFIX, fabric_namespace
from gpulease.runner.netns import InstanceNetwork, probe
from gpulease.schemas.runner import FabricLink


def once(root: Path, name: str, fabric: FabricLink | None) -> float:
    network = InstanceNetwork(name, root, fabric=fabric)
    started = time.perf_counter()
    try:
        network.ensure()
    finally:
        network.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpl-fabric-") as tmp:
        root = Path(tmp) / "netns"
        if (reason := probe(root)) is not None:
            raise SystemExit(f"no instance network here: {reason}")
        with fabric_namespace() as netns:
            link = FabricLink(
                address=f"10.213.0.1/{PREFIX}",
                peers=("10.213.0.2",),
                parent=PARENT,
                parent_netns=netns,
            )
            plain: list[float] = []
            fabric: list[float] = []
            for index in range(args.rounds):
                plain.append(once(root, f"p{index}", None))
                fabric.append(once(root, f"f{index}", link))
    base, value = statistics.median(plain), statistics.median(fabric)
    emit(
        "instance network up and down with a fabric interface (median ms)",
        f"{value * 1000:.1f} ms",
        f"{base * 1000:.1f} ms without one",
        f"{value / base:.2f}×",
        "",
        None,
    )


if __name__ == "__main__":
    main()
