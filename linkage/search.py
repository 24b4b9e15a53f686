"""One (primary, secondary) pair validated and searched: the expensive, noise-free stage of a job.

    check_identifiers(query, base, k, party, metric) -> (query, base) as the metric's arrays, or LinkageError
    searcher(base, metric=, k=, party=)              -> query -> (dist (m, k) float64 ascending, idx (m, k) int64)
    search(query, base, metric=, k=, party=)         -> the same for one query
    under_floor(recall, approx, party, k, m)         -> an approximate search's recall, refused under its floor

The exact searches per kind of identifier are linkage.exact's; the approximate indexes linkage.approx's.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from scipy.spatial import cKDTree

from linkage.approx import Approx
from linkage.contracts import LinkageError
from linkage.exact import Progress, _tree_topk, topk
from linkage.metrics import metric as metric_named


def _as_identifiers(ids, metric: str, who: str) -> np.ndarray:
    """Coerce one party's identifiers to the metric's array type, refusing what does not fit."""
    return metric_named(metric).identifiers(ids, who)


def _columns(arr: np.ndarray) -> int:
    return 1 if arr.ndim == 1 else arr.shape[1]


def check_identifiers(query, base, k: int, party: str, metric: str = "euclidean") -> tuple[np.ndarray, np.ndarray]:
    """Validate a (primary, secondary) pair for one metric; return them as the metric's arrays."""
    return _pair(_as_identifiers(query, metric, "primary"), _as_identifiers(base, metric, party), k, party, metric)


def _pair(query: np.ndarray, base: np.ndarray, k: int, party: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Both parties' identifiers, each already its metric's array, checked against each other."""
    if len(query) == 0:
        raise LinkageError("the primary party has zero rows to link")
    if len(base) == 0:
        raise LinkageError(f"secondary party {party!r} has zero rows to link against")
    kind = metric_named(metric).kind
    if kind == "strings" and _columns(query) != _columns(base):
        raise LinkageError(
            f"string columns differ: primary has {_columns(query)}, party {party!r} has {_columns(base)}"
        )
    if kind != "strings" and query.shape[1] != base.shape[1]:
        what = "bytes per filter" if kind == "bits" else "identifier dimensions"
        raise LinkageError(f"{what} differ: primary has {query.shape[1]}, party {party!r} has {base.shape[1]}")
    if not 1 <= k <= len(base):
        raise LinkageError(f"K={k} must be between 1 and the size of party {party!r} ({len(base)} rows)")
    return query, base


def searcher(base, *, metric: str, k: int, party: str) -> Callable[[object], tuple[np.ndarray, np.ndarray]]:
    """query -> :func:`search` (query, base): for many chunks of queries against one base, which is
    validated, and its k-d tree (numbers at d <= 8, in the metric's Minkowski order) built, once
    rather than per chunk."""
    base = _as_identifiers(base, metric, party)
    how = metric_named(metric)
    tree = cKDTree(base) if how.kind == "numbers" and base.shape[1] <= 8 else None

    def find(query) -> tuple[np.ndarray, np.ndarray]:
        query, _ = _pair(_as_identifiers(query, metric, "primary"), base, k, party, metric)
        return topk(metric, query, base, k) if tree is None else _tree_topk(tree, query, k, how.p)

    return find


def search(
    query, base, *, metric: str, k: int, party: str, progress: Progress | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Validate one (primary, secondary) pair and find each primary record's K nearest: (dist, idx)."""
    query, base = check_identifiers(query, base, k, party, metric)
    return topk(metric, query, base, k, progress)


def under_floor(recall: float, approx: Approx, party: str, k: int, m: int) -> float:
    """The recall measured on a sample of m records, refused by name under the job's floor."""
    if recall < approx.recall_floor:
        raise LinkageError(
            f"party {party!r}: the {approx.method} search found {recall:.4f} of the true top-{k} "
            f"(tie-aware, on {min(m, approx.sample)} records), under the recall floor "
            f"{approx.recall_floor}; widen the search (width: ef_search / nprobe / candidates) or search exactly"
        )
    return recall
