"""The README tour's data script runs on Python alone and writes the real digit scans."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "digits" / "make_dataset.py"


def test_make_dataset_needs_no_package_and_writes_the_scans(tmp_path: Path) -> None:
    datasets = pytest.importorskip("sklearn.datasets")
    out = tmp_path / "data"
    # -I -S: no site-packages at all, so nothing beyond the standard library
    subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), "--out", str(out)], check=True)
    digits = datasets.load_digits()
    files = sorted(out.rglob("*.png"))
    assert len(files) == len(digits.images)
    splits = Counter(f.parent.parent.name for f in files)
    assert splits["val"] == int(len(files) * 0.2) and splits["train"] == len(files) - splits["val"]
    for file in files:
        i = int(file.stem)
        assert int(file.parent.name) == digits.target[i], file
        with Image.open(file) as img:
            assert img.mode == "L" and img.size == (8, 8)
            got = np.asarray(img)
        want = (digits.images[i] * (255 / 16)).clip(0, 255).astype(np.uint8)
        assert (got == want).all(), file
