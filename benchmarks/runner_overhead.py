"""Runner overhead on training: a small CNN on scikit-learn's digits (1,797 8×8 images)
trained through `gpulease run` (the `pytorch` template, the bubblewrap sandbox, the runner's
metrics capture of `track.log` and of key=value lines) beside the same script run bare with
the same interpreter and torch, in turns (run, bare, run, bare, ...: load that drifts on
the host falls on both). Figure: median images/s over every epoch after each run's first,
through gpulease ÷ bare (target >= 0.98).

On a shared host the speed can move by a quarter for seconds at a time, on whichever side
is running then (on the project's 2-core machine the pairs' own ratios ranged 0.75-1.81 in
one set of nine), so the default takes seven short pairs rather than three long ones: a
slow spell falls on fewer of one side's samples. The median of the pairs' own ratios is
printed beside the figure.

Both sides train on one thread (torch.set_num_threads(1)), so that the ratio measures the
runner and the sandbox, not how many of the host's cores an instance's CPU share allows.

    .venv/bin/python benchmarks/runner_overhead.py [--epochs 6] [--pairs 7]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from results import emit
from sklearn.datasets import load_digits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from processes import ENV_CACHE, running_platform  # noqa: E402

TARGET = 0.98
TRAIN = """
import sys, time
import numpy as np
import torch
from torch import nn
try:
    from gpulease import track
except ImportError:
    track = None

torch.set_num_threads(1)
torch.manual_seed(0)
data = np.load("digits.npz")
x = torch.from_numpy(data["images"]).float().unsqueeze(1) / 16.0
y = torch.from_numpy(data["labels"]).long()
model = nn.Sequential(
    nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
    nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 16, 10),
)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
print(f"torch={torch.__version__} python={sys.executable}", flush=True)
for epoch in range(int(sys.argv[1])):
    started = time.perf_counter()
    order = torch.randperm(len(x))
    for i in range(0, len(x), 32):
        idx = order[i : i + 32]
        loss = loss_fn(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if track is not None:
            track.log(step=epoch * 100 + i // 32, loss=loss.item())
    rate = len(x) / (time.perf_counter() - started)
    print(f"epoch={epoch} loss={loss.item():.4f} images_per_s={rate:.3f}", flush=True)
"""
RATE = re.compile(r"^epoch=(\d+) .*images_per_s=([\d.]+)$", re.MULTILINE)


def rates(output: str) -> list[float]:
    """images/s of every epoch after the first (the first pays for warm-up)."""
    found = [(int(e), float(r)) for e, r in RATE.findall(output)]
    return [rate for epoch, rate in found if epoch > 0]


def template_python() -> str:
    """The pytorch template's interpreter once gpulease built it (the same torch the run
    used); this venv's otherwise."""
    built = sorted(ENV_CACHE.glob("pytorch-*/bin/python"))
    return str(built[0]) if built else sys.executable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=7, help="gpulease run, then bare, N times")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        task = root / "task"
        task.mkdir()
        digits = load_digits()
        np.savez(task / "digits.npz", images=digits.images, labels=digits.target)
        (task / "train.py").write_text(TRAIN)
        (task / "task.yaml").write_text(
            "name: overhead\nresources:\n  accelerators: T4:1\nworkdir: .\n"
            f"run: python train.py {args.epochs}\n"
        )
        with running_platform(root, f"sqlite:///{root}/home/gpulease.db", "T4:1") as platform:
            platform.cli(
                "register", "--server", platform.url, "--name", "bench",
                "--password", "password-123",
            )  # fmt: skip
            ran: list[float] = []
            alone: list[float] = []
            pairs: list[float] = []  # each pair's own ratio, shown beside the figure
            for _ in range(args.pairs):  # in turns, so that drifting load falls on both
                through = platform.cli("run", str(task / "task.yaml"), timeout=1800).stdout
                python = template_python()
                bare = subprocess.run(
                    [python, "train.py", str(args.epochs)],
                    cwd=task,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                through_rates, bare_rates = rates(through), rates(bare)
                ran += through_rates
                alone += bare_rates
                pair = statistics.median(through_rates) / statistics.median(bare_rates)
                pairs.append(pair)
                print(f"pair {len(pairs)}: gpulease run / bare {pair:.3f}", flush=True)
    assert len(ran) >= 5 and len(alone) >= 5, (through, bare)
    ratio = statistics.median(ran) / statistics.median(alone)
    print(f"bare ({python}): median {statistics.median(alone):,.0f} images/s of {alone}")
    print(f"gpulease run: median {statistics.median(ran):,.0f} images/s of {ran}")
    print(
        f"ratio {ratio:.3f} (target >= {TARGET}); by pair {min(pairs):.3f}-{max(pairs):.3f}, "
        f"median pair {statistics.median(pairs):.3f}"
    )
    emit(
        "training images/s through `gpulease run` (CPU, digits CNN)",
        f"{statistics.median(ran):,.0f} images/s",
        f"bare script {statistics.median(alone):,.0f} images/s",
        f"{ratio:.3f}×",
        f">= {TARGET}×",
        ratio >= TARGET,
    )


if __name__ == "__main__":
    main()
