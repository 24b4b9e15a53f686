"""Linkage quality without training: recall of known true links, and the paper's Delta (Def. 1)."""

from __future__ import annotations

import numpy as np

from linkage.contracts import LinkageError


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
    raw = np.asarray(sims, dtype=np.float64)  # (m, K)
    if not 1 <= matches <= raw.shape[1]:
        raise LinkageError(f"a baseline of {matches} matching neighbours: it must be 1 to K = {raw.shape[1]}")
    if not np.isfinite(raw).all():
        raise LinkageError(f"{int((~np.isfinite(raw)).sum())} of {raw.size} similarities are non-finite (NaN or inf)")
    s = scaled(raw)  # (m, K)
    return float(((1.0 - s[:, :matches]).sum(1) + s[:, matches:].sum(1)).mean())


SMALL_DELTA = 0.05  # this message's threshold (a fraction of Delta's maximum, K), not the paper's


def delta_verdict(top1: float, avg: float, k: int, k_avg: int) -> list[str]:
    """What Definition 1's Deltas mean for the choice between FedSim (K neighbours, weighted by
    learnt gates) and the baselines that keep the most similar record only (Top1Sim) or average
    ``k_avg`` neighbours with equal weights (AvgSim). Each Delta is at most K (per record, the
    scaled similarity a baseline loses or over-counts over the K links); "small" is under
    SMALL_DELTA of that."""

    def one(name: str, delta: float, what: str, instead: str) -> str:
        share = delta / k if k else 0.0
        head = f"Delta vs {name} = {delta:.3f} ({share:.1%} of its maximum K={k})"
        if share < SMALL_DELTA:
            return f"{head}: small: {instead}"
        return (
            f"{head} > 0: linking with K={k} neighbours is expected to help over {what}: per record, "
            f"{name} would lose or over-weight about {delta:.2g} units of scaled similarity that FedSim's "
            "gates can use; the larger, the larger the expected gain"
        )

    return [
        one(
            "Top1Sim",
            top1,
            "keeping only the most similar match",
            "the most similar record carries nearly all the similarity: keeping only it (method top1sim, "
            "or exact) is likely about as good as FedSim; try it, or a small K, first",
        ),
        one(
            f"AvgSim (K={k_avg})",
            avg,
            f"averaging {k_avg} neighbours with equal weights",
            f"the {k_avg} neighbours are about equally similar: averaging them (method avgsim) is likely "
            "about as good as weighting them",
        ),
        "what this is: a training-free estimate from the similarities alone (paper Definition 1; the paper "
        "found it correlated with the measured gain over the baseline, it predicts no metric value). It "
        "assumes similar identifiers mean related records, counts pairs beyond the K links as 0 (a lower "
        "bound), compares baselines within this linkage only (not across metrics or jobs), and does not say "
        "whether the secondary's features help at all: for that, train method solo and compare",
    ]
