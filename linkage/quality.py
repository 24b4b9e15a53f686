"""Linkage quality without training: recall of known true links, and the paper's Delta (Def. 1)."""

from __future__ import annotations

import numpy as np


def recall_at(true_row: np.ndarray, neighbour_rows: np.ndarray, k: int) -> float:
    """Fraction of records with a known true link (true_row >= 0) whose link is among the first k.

    true_row: (m,) the secondary row of each primary record's true match, -1 where unknown.
    neighbour_rows: (m, K) secondary rows in descending similarity.
    """
    known = true_row >= 0
    if not known.any():
        return float("nan")
    hit = (neighbour_rows[known, :k] == true_row[known, None]).any(axis=1)
    return float(hit.mean())


def scaled(sims: np.ndarray) -> np.ndarray:
    """Similarities min-max scaled to [0, 1] over the whole job (Definition 1's 'scaled similarity')."""
    lo, hi = float(sims.min()), float(sims.max())
    return (sims - lo) / (hi - lo) if hi > lo else np.ones_like(sims)


def improvement_delta(sims: np.ndarray, matches: int) -> float:
    """Delta(F) of paper Definition 1 for a baseline that uses the first `matches` neighbours.

    sims: (m, K) similarities, descending per row. The baseline treats its `matches` neighbours
    as equal matches (Top1Sim: 1, AvgSim: K) and ignores the others; Delta_i sums the information
    it over-counts (1 - s over matches) and loses (s over the non-matches). Pairs beyond the K
    linked ones are unknown here and count as 0, so Delta is a lower bound.
    """
    s = scaled(np.asarray(sims, dtype=np.float64))  # (m, K)
    return float(((1.0 - s[:, :matches]).sum(1) + s[:, matches:].sum(1)).mean())
