"""Exact top-K over string identifiers for every string metric, on one column or several.

Identifiers are (n,) strings (one column) or (n, c) strings (c columns, e.g. name and address).
Several columns are joined with one space, in column order, and compared as one string, for every
metric: on FEBRL4 the joined names (and address) found more true links than the mean of
per-column distances in 7 of 8 (scorer, columns) cases at rank 1 and all 8 at rank 10
(docs/benchmarks.md, "String scorers"): a value in the wrong field or a missing one costs little
once joined.
Every metric is a distance (smaller = more similar):

  edit              raw Levenshtein distance, an integer; linkage.strings.topk_edit.
  levenshtein_norm  Levenshtein distance / max(len a, len b), in [0, 1] (0 for two empty strings);
                    rapidfuzz Levenshtein.normalized_distance.
  jaro_winkler      1 - the Jaro-Winkler similarity (prefix weight 0.1, prefix up to 4 characters);
                    rapidfuzz JaroWinkler.normalized_distance.
  token_sort        1 - fuzz.token_sort_ratio / 100: the Indel distance (insertions and deletions)
                    of the two strings with their whitespace-separated words sorted, divided by the
                    sum of their lengths; word order does not count.
  qgram_cosine      1 - the cosine of the two strings' character q-gram count vectors, q = QGRAM,
                    each string padded with q - 1 PAD characters on both ends (the first and last
                    characters weigh as much as inner ones; a 1-character string has q-grams);
                    linkage.qgram.topk_cosine.

levenshtein_norm, jaro_winkler and token_sort are searched by brute force: blocks of query rows
against every base row (rapidfuzz ``process.cdist`` on all cores, float32 distances), then a
threshold from a strided sample of each row's columns keeps a few candidates to sort. Results
are exact up to ties (which of several base rows at the K-th distance is returned; among equal
distances, lower base rows first, except edit: shorter base strings first) and, for these three,
up to float32 rounding of the distances.
Strings are compared as given: normalise them first (linkage.strings.normalize_strings).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import rapidfuzz.distance
from rapidfuzz import process

from linkage.contracts import STRING_METRICS, LinkageError
from linkage.metrics import metric as metric_named
from linkage.strings import topk_edit

QGRAM = 3  # q of qgram_cosine (trigrams: measured against bigrams in docs/benchmarks.md, "String scorers")
PAD = "_"  # q-gram padding, as linkage.encode.bloom_strings pads
SAMPLE = 16  # the selection's threshold comes from every SAMPLE-th column of a row


def scorer(metric: str) -> Callable:
    """The metric's rapidfuzz distance (linkage.metrics: Metric.scorer, e.g. Levenshtein.distance)."""
    cls, fn = metric_named(metric).scorer.split(".")
    return getattr(getattr(rapidfuzz.distance, cls), fn)


def joined(ids) -> list[str]:
    """(n,) or (n, c) string identifiers -> n strings, each row's columns joined with one space."""
    arr = np.asarray(ids)
    if arr.ndim not in (1, 2) or (arr.ndim == 2 and arr.shape[1] == 0):
        raise LinkageError(f"string identifiers must be (rows,) or (rows, columns); got shape {arr.shape}")
    rows = arr.tolist()
    bad = next(
        (i for i, r in enumerate(rows) if not all(isinstance(s, str) for s in ([r] if arr.ndim == 1 else r))), None
    )
    if bad is not None:
        raise LinkageError(f"string identifier row {bad} is {rows[bad]!r}: not all strings")
    return rows if arr.ndim == 1 else [" ".join(r) for r in rows]


def sort_tokens(s: str) -> str:
    """The string's whitespace-separated words, sorted, joined with one space (token_sort's input)."""
    return " ".join(sorted(s.split()))


def smallest(d: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k smallest of each row of d (rows, n): dist ascending (ties by column), and their columns.

    The threshold t = the k-th smallest of every SAMPLE-th column bounds the row's k-th smallest
    from above (the sample's k values are <= t), so sorting the entries <= t is exact; about
    k * SAMPLE of them per row."""
    rows, n = d.shape
    step = max(1, min(SAMPLE, n // k))
    t = np.partition(d[:, ::step], k - 1, axis=1)[:, k - 1]  # (rows,)
    r, c = np.nonzero(d <= t[:, None])  # row-major: by row, then column
    v = d[r, c]
    o = np.lexsort((c, v, r))  # by row, then distance, then column
    r, c, v = r[o], c[o], v[o]
    first = np.searchsorted(r, np.arange(rows))  # each row's run starts here (>= k entries each)
    take = first[:, None] + np.arange(k)  # (rows, k)
    return v[take].astype(np.float64), c[take].astype(np.int64)


def _check(metric: str, query: list[str], base: list[str], k) -> None:
    if metric not in STRING_METRICS:
        raise LinkageError(f"unknown string metric {metric!r}; known: {list(STRING_METRICS)}")
    if not query or not base:
        raise LinkageError(f"nothing to link: {len(query)} query and {len(base)} base rows")
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= len(base):
        raise LinkageError(f"k={k!r} must be an integer in 1..len(base)={len(base)}")


def topk_strings(
    metric: str,
    query,
    base,
    k: int,
    *,
    workers: int = -1,
    mem_cap_mb: int = 1024,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest base rows of each query row by a string metric (module docstring).

    query (m,) or (m, c), base (n,) or (n, c) strings, the same c. Returns dist (m, k) float64,
    ascending per row, and idx (m, k) int64 into base. workers: rapidfuzz threads (-1 = all cores);
    mem_cap_mb bounds the distance blocks held at once; progress(done, m) as query rows finish.
    """
    qcols, bcols = (1 if np.ndim(x) == 1 else np.shape(x)[1] for x in (query, base))
    if qcols != bcols:
        raise LinkageError(f"string columns differ: the query has {qcols}, the base {bcols}")
    query, base = joined(query), joined(base)
    _check(metric, query, base, k)
    how = metric_named(metric)
    if how.exact == "edit":
        return topk_edit(query, base, k, workers=workers, mem_cap_mb=mem_cap_mb, progress=progress)
    if how.exact == "qgram":
        from linkage.qgram import topk_cosine  # lazy: numba and scipy, for this metric's search only

        return topk_cosine(query, base, k, q=QGRAM, pad=PAD, progress=progress)
    if how.sort_words:
        query, base = [sort_tokens(s) for s in query], [sort_tokens(s) for s in base]
    m, n = len(query), len(base)
    rows = max(1, min(1024, (mem_cap_mb << 20) // (4 * 3 * n)))  # a float32 block, its mask and scratch
    dist, idx = np.empty((m, k)), np.empty((m, k), np.int64)
    for lo in range(0, m, rows):
        hi = min(m, lo + rows)
        d = process.cdist(query[lo:hi], base, scorer=scorer(metric), dtype=np.float32, workers=workers)
        dist[lo:hi], idx[lo:hi] = smallest(d, k)
        if progress:
            progress(hi, m)
    return dist, idx
