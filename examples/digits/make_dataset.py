"""Write scikit-learn's handwritten digits (real 8x8 scans, shipped with the package, no
download) as an ImageFolder tree: OUT/{train,val}/<digit>/<n>.png."""

from __future__ import annotations

import argparse
from pathlib import Path

try:
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits
except ImportError as missing:
    raise SystemExit(
        f"{missing.name} is missing: install the examples' packages with "
        "pip install -e '.[examples]' (scikit-learn, pillow, numpy), then run this again"
    ) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("data"))
    parser.add_argument("--val-fraction", type=float, default=0.2)
    args = parser.parse_args()
    digits = load_digits()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(digits.images))
    n_val = int(len(order) * args.val_fraction)
    for rank, i in enumerate(order):
        split = "val" if rank < n_val else "train"
        folder = args.out / split / str(digits.target[i])
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (digits.images[i] * (255 / 16)).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(folder / f"{i}.png")
    print(f"wrote {len(order)} images to {args.out} ({n_val} for validation)")


if __name__ == "__main__":
    main()
