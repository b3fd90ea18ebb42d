"""Write the handwritten digits in digits.csv.gz beside this script (1,797 real 8x8 scans,
no download) as an ImageFolder tree: OUT/{train,val}/<digit>/<n>.png.

Needs nothing beyond Python itself: `python examples/digits/make_dataset.py` works in the
same environment as `pip install -e .` (the training side, train.py, needs torch, numpy and
Pillow, which the instance's `pytorch` template has).

digits.csv.gz is scikit-learn's copy of the test set of the UCI "Optical Recognition of
Handwritten Digits" data set (E. Alpaydin, C. Kaynak; CC BY 4.0,
https://archive.ics.uci.edu/dataset/80): one scan a line, 64 pixel values from 0 to 16 row
by row, then the digit.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import random
import struct
import zlib
from pathlib import Path

DATA = Path(__file__).with_name("digits.csv.gz")
SIDE = 8


def png_gray(pixels: list[int], width: int, height: int) -> bytes:
    """An 8-bit grayscale PNG of row-major pixels (0..255)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    rows = b"".join(b"\x00" + bytes(pixels[y * width : (y + 1) * width]) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )


def load_digits() -> list[tuple[list[int], int]]:
    """(64 pixels from 0 to 16, digit) for each scan in digits.csv.gz."""
    with gzip.open(DATA, "rt", newline="") as f:
        return [([int(v) for v in row[:-1]], int(row[-1])) for row in csv.reader(f) if row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("data"))
    parser.add_argument("--val-fraction", type=float, default=0.2)
    args = parser.parse_args()
    digits = load_digits()
    order = list(range(len(digits)))
    random.Random(0).shuffle(order)
    n_val = int(len(order) * args.val_fraction)
    for rank, i in enumerate(order):
        values, digit = digits[i]
        split = "val" if rank < n_val else "train"
        folder = args.out / split / str(digit)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = [min(255, v * 255 // 16) for v in values]
        (folder / f"{i}.png").write_bytes(png_gray(pixels, SIDE, SIDE))
    print(f"wrote {len(order)} images to {args.out} ({n_val} for validation)")


if __name__ == "__main__":
    main()
