"""Exact top-K search per kind of identifier (linkage.metrics): numbers by a k-d tree or chunked
matrix products (blocks of the metric's Minkowski distance where it is not Euclidean), bits by
the numba Hamming kernel (linkage/hamming.py), strings by the scorers
(linkage/scorers.py). The pipeline (linkage/pipeline.py) and the approximate search's recall check
(linkage/approx.py) both use it, so it imports neither.

    topk(metric, query, base, k, progress=None) -> (dist (m, k) float64, idx (m, k) int64), nearest first
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from scipy.spatial import cKDTree, distance

from linkage.metrics import metric as metric_named
from linkage.scorers import topk_strings

Progress = Callable[[int, int], None]


BLOCK_BYTES = 1 << 26  # the matrix-product search's (rows, n) float64 distance block: 64 MB


def topk_bruteforce(query: np.ndarray, base: np.ndarray, k: int, chunk: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-K by distance matrices in blocks of ``chunk`` query rows (0: as many as fit
    BLOCK_BYTES against the whole base, at most 4096); the oracle, and the fast path at high d."""
    shift = np.asarray(base, np.float64).mean(0)  # centre: |q|^2 - 2 q.b + |b|^2 cancels badly far from 0
    q, b = np.asarray(query, np.float64) - shift, np.asarray(base, np.float64) - shift
    b_sq = (b * b).sum(1)
    chunk = chunk or max(1, min(4096, BLOCK_BYTES // (8 * max(len(b), 1))))
    dist_out = np.empty((len(q), k))
    idx_out = np.empty((len(q), k), dtype=np.int64)
    for lo in range(0, len(q), chunk):
        qc = q[lo : lo + chunk]
        d2 = qc @ b.T  # (c, n), then in place: |q|^2 - 2 q.b + |b|^2, the same arithmetic in the same order
        d2 *= -2.0
        d2 += (qc * qc).sum(1)[:, None]
        d2 += b_sq[None, :]
        np.maximum(d2, 0.0, out=d2)
        pd2, idx_out[lo : lo + chunk] = _k_smallest(d2, k)
        dist_out[lo : lo + chunk] = np.sqrt(pd2)
    return dist_out, idx_out


def _k_smallest(d: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(values (c, k), columns (c, k)) of each row's k smallest of a block d (c, n), ascending,
    ties in column order (a stable sort of the k)."""
    n = d.shape[1]
    part = np.argpartition(d, k - 1, axis=1)[:, :k] if k < n else np.tile(np.arange(n), (len(d), 1))
    pd = np.take_along_axis(d, part, axis=1)
    order = np.argsort(pd, axis=1, kind="stable")
    return np.take_along_axis(pd, order, axis=1), np.take_along_axis(part, order, axis=1)


def topk_minkowski(query: np.ndarray, base: np.ndarray, k: int, p: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-K under the Minkowski distance of order p, by distance blocks of BLOCK_BYTES (the
    brute force of a metric that is not Euclidean, at high d)."""
    q, b = np.asarray(query, np.float64), np.asarray(base, np.float64)
    chunk = max(1, min(4096, BLOCK_BYTES // (8 * max(len(b), 1))))  # cdist's (c, n) float64 block
    dist_out, idx_out = np.empty((len(q), k)), np.empty((len(q), k), dtype=np.int64)
    for lo in range(0, len(q), chunk):
        d = distance.cdist(q[lo : lo + chunk], b, "minkowski", p=p)  # (c, n)
        dist_out[lo : lo + chunk], idx_out[lo : lo + chunk] = _k_smallest(d, k)
    return dist_out, idx_out


def topk_kdtree(query: np.ndarray, base: np.ndarray, k: int, p: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-K with scipy's cKDTree on all cores: the fastest exact method measured at d <= 4."""
    return _tree_topk(cKDTree(base), query, k, p)


def _tree_topk(tree: cKDTree, query: np.ndarray, k: int, p: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    dist, idx = tree.query(query, k=k, p=p, workers=-1)
    if k == 1:
        dist, idx = dist[:, None], idx[:, None]
    return dist.astype(np.float64, copy=False), idx.astype(np.int64, copy=False)  # no copy: already these dtypes


def topk_euclidean(
    query: np.ndarray, base: np.ndarray, k: int, progress: Progress | None = None, p: float = 2.0
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-K of numbers under the Minkowski distance of order p (2: Euclidean): k-d tree at
    low dimension, chunked matrix products (Euclidean) or distance blocks above."""
    if query.shape[1] <= 8:
        out = topk_kdtree(query, base, k, p)
    else:
        out = topk_bruteforce(query, base, k) if p == 2.0 else topk_minkowski(query, base, k, p)
    if progress is not None:
        progress(len(query), len(query))
    return out


def topk(metric: str, query, base, k: int, progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Dispatch to the metric's exact top-K (linkage.metrics; edit: exact up to ties, certified by
    length windows)."""
    how = metric_named(metric)
    kind = how.kind
    if kind == "numbers":
        return topk_euclidean(query, base, k, progress, how.p)
    if kind == "strings":
        return topk_strings(metric, query, base, k, progress=progress)
    from linkage.hamming import topk_hamming  # lazy: numba (and its compile cache set-up), for bits only

    return topk_hamming(query, base, k, progress=progress)
