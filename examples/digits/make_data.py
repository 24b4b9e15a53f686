"""Writes this example's three parties from scikit-learn's bundled 8x8 digits (1,797 images,
UCI optdigits) and a fixed seed: the label holder knows each image's digit, one guest holds the
left half of the pixels and the other the right half, each of only some of the images. Every
party names an image by the same id, so Entity Augmentation needs no linkage.

    python examples/digits/make_data.py [OUT_FOLDER]   # default: this folder
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

SEED = 16
BOTH, LEFT_ONLY = 0.45, 0.275  # of the images: held by both guests, by the left one only (the rest: right only)


def main(out: Path) -> None:
    from sklearn.datasets import load_digits

    d = load_digits()
    n = len(d.target)
    rng = np.random.default_rng(SEED)
    ids = np.array([f"img{i:04d}" for i in range(n)])
    draw = rng.random(n)
    held = {"left": draw < BOTH + LEFT_ONLY, "right": (draw < BOTH) | (draw >= BOTH + LEFT_ONLY)}
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"image_id": ids, "digit": d.target}).to_csv(out / "labels.csv", index=False)
    images = d.images.astype(int)  # (n, 8, 8) grey levels 0..16
    for guest, cols in (("left", range(0, 4)), ("right", range(4, 8))):
        rows = rng.permutation(np.flatnonzero(held[guest]))  # each party keeps its own row order
        pixels = {f"px_r{r}c{c}": images[rows, r, c] for r in range(8) for c in cols}
        pd.DataFrame({"image_id": ids[rows], **pixels}).to_csv(out / f"{guest}.csv", index=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
