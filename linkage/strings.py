"""Top-K edit-distance (Levenshtein) search over string identifiers.

For each query string, the k base strings with the smallest Levenshtein distance, exact up to ties
(which of several base strings at the K-th distance is returned). It is brute force made cheaper:

1. Distinct base strings are computed once (copies expanded at the end) and sorted by length, so
   "all base strings of length L-w..L+w" is a slice.
2. A pilot compares every query with a random sample of the base; 1 + a low order statistic of those
   distances is a guess w of the query's K-th distance.
3. Queries sorted by (length, w) go in blocks through rapidfuzz's `process.cdist` against their length
   window only, base strings on its SIMD side. Since lev(a, b) >= |len(a) - len(b)|, a row whose K-th
   distance within the window is <= the window's reach is exact. Rows whose guess was too low are
   retried from the same block, and the rare rows the window cannot certify redone on the whole base.
   At the game shape the windows skip only about a quarter of the pairs; most of the gain over plain
   cdist + argpartition is cdist's pairs/s with base strings on the SIMD side in big blocks, and a
   top-K that thresholds first and sorts only what passes.

Strings are compared as given: normalise them first with `normalize_strings` if wanted.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Callable, Sequence

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Levenshtein

from linkage.contracts import LinkageError

PILOT = 8192  # base strings sampled to guess each query's K-th distance
GUESS = 2.0  # guess = 1 + the sample's (GUESS * k * sample / n)-th distance; too low only costs a redo
BLOCK = 1024  # most queries per cdist call
SETUP = 64  # a cdist call's set-up of its base slice, in query rows' worth of time
_WS = re.compile(r"\s+")


def normalize_strings(seq: Sequence[str]) -> list[str]:
    """Unicode NFKC, casefold (lower-case), runs of whitespace -> one space, strip the ends."""
    _check_strings(seq, "strings")
    return [_WS.sub(" ", unicodedata.normalize("NFKC", s).casefold()).strip() for s in seq]


def _check_strings(seq: Sequence, name: str) -> None:
    if len(seq) == 0:
        raise LinkageError(f"{name} is empty: nothing to link")
    bad = next((i for i, s in enumerate(seq) if not isinstance(s, str)), None)
    if bad is not None:
        raise LinkageError(f"{name}[{bad}] is {seq[bad]!r} ({type(seq[bad]).__name__}), not a string")


def _check(query: Sequence[str], base: Sequence[str], k: int) -> None:
    _check_strings(query, "query")
    _check_strings(base, "base")
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= len(base):
        raise LinkageError(f"k={k!r} must be an integer in 1..len(base)={len(base)}")


def _cdist(a: Sequence[str], b: Sequence[str], dtype, workers: int) -> np.ndarray:
    return process.cdist(a, b, scorer=Levenshtein.distance, dtype=dtype, workers=workers)


def topk_edit(
    query: Sequence[str],
    base: Sequence[str],
    k: int,
    *,
    workers: int = -1,
    mem_cap_mb: int = 1024,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact (up to ties) k nearest base strings of each query by Levenshtein distance.

    Returns dist (m, k) float64, ascending per row, and idx (m, k) int64 into base; ties in a fixed
    order (shorter base strings first). workers: rapidfuzz threads (-1 = all cores); mem_cap_mb bounds
    the distance block held at once; progress(done, m) is called as query rows finish.
    """
    _check(query, base, k)
    # distinct base strings, sorted by length: a length window is a contiguous slice of `uniq`
    uniq, ulen, inv, mult, groups = _distinct_by_length(base)
    m, nu = len(query), len(uniq)
    qlen = np.fromiter(map(len, query), np.int64, m)
    top, dtype, cap, rows_cap = _block_sizes(qlen, ulen, mem_cap_mb)
    w = _guess(query, [uniq[u] for u in inv], k, dtype, cap, workers)  # (m,)

    dist, idx = np.empty((m, k)), np.empty((m, k), np.int64)
    long_from = int(np.searchsorted(ulen, 65))  # distinct strings longer than 64 chars start here
    order = np.lexsort((w, qlen))  # (m,) by length, then guess
    redo, done = [], 0
    for rows in _blocks(qlen[order], w[order], ulen, rows_cap, order):
        L, wm = qlen[rows], w[rows].max()
        lo, hi = np.searchsorted(ulen, L.min() - wm, "left"), np.searchsorted(ulen, L.max() + wm, "right")
        parts = _dists([query[q] for q in rows], uniq, lo, hi, long_from, dtype, workers)
        # a row is exact once its K-th distance is <= reach: every string outside the window is farther
        far = np.full(len(rows), top)
        reach = np.minimum(L - (L.min() - wm) if lo > 0 else far, (L.max() + wm) - L if hi < nu else far)
        t = np.minimum(w[rows], top).astype(dtype)
        ok, dd, ii = _topk(*_select(parts, t), len(rows), groups, k)
        dist[rows[ok]], idx[rows[ok]] = dd, ii
        retry = np.flatnonzero(~ok & (reach > t))  # guess too low, but the window reaches further
        if len(retry):
            t = np.minimum(_kth(parts, retry, mult, k, top), reach[retry]).astype(dtype)
            ok2, dd, ii = _topk(*_select(parts, t, retry), len(retry), groups, k)
            dist[rows[retry[ok2]]], idx[rows[retry[ok2]]] = dd, ii
            ok[retry[ok2]] = True
        redo.extend(rows[~ok])
        done += len(rows)
        if progress:
            progress(done - len(redo), m)

    # rows whose K-th distance lies beyond their window: the whole base
    for i in range(0, len(redo), rows_cap):
        rows = np.array(redo[i : i + rows_cap])
        parts = _dists([query[q] for q in rows], uniq, 0, nu, long_from, dtype, workers)
        t = _kth(parts, np.arange(len(rows)), mult, k, top).astype(dtype)
        _, dist[rows], idx[rows] = _topk(*_select(parts, t), len(rows), groups, k)
    if progress and redo:
        progress(m, m)
    return dist, idx


def _distinct_by_length(base: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, tuple]:
    """The distinct base strings, stably sorted by length: uniq (nu,) and their lengths ulen (nu,);
    inv (n,) base -> distinct id; mult (nu,) copies of each; groups: base ids ordered by distinct id,
    and (nu + 1,) offsets of each distinct id's run in them."""
    first: dict[str, int] = {}
    inv = np.fromiter((first.setdefault(s, len(first)) for s in base), np.int64, len(base))  # (n,) base -> distinct
    ulen = np.fromiter(map(len, first), np.int64, len(first))
    by_len = np.argsort(ulen, kind="stable")
    uniq, ulen, nu = list(first), ulen[by_len], len(first)
    uniq = [uniq[i] for i in by_len]
    inv = np.argsort(by_len)[inv]
    mult = np.bincount(inv, minlength=nu)  # (nu,) copies of each distinct string
    groups = (np.argsort(inv, kind="stable"), np.concatenate([[0], np.cumsum(mult)]))  # base ids by distinct id
    return uniq, ulen, inv, mult, groups


def _block_sizes(qlen: np.ndarray, ulen: np.ndarray, mem_cap_mb: int) -> tuple[int, type, int, int]:
    """top (> any distance), the distances' dtype, cap (distances in one block) and query rows per block."""
    top = int(max(qlen.max(), ulen.max())) + 1  # > any distance
    dtype = np.uint8 if top <= 255 else np.int32
    cap = max(1, mem_cap_mb << 20) // 4 // np.dtype(dtype).itemsize  # distances in one block (+ mask, selections)
    rows_cap = max(1, min(BLOCK, cap // len(ulen)))
    return top, dtype, cap, rows_cap


def _guess(query, base, k, dtype, cap, workers) -> np.ndarray:
    """(m,) a guess of each query's K-th distance: 1 + an order statistic of its distances to a sample."""
    rng = np.random.default_rng(0)  # a pilot for the search's bound only: it protects no party
    s = min(len(base), PILOT)
    sample = [base[i] for i in rng.choice(len(base), s, replace=False)]
    r = min(s, max(1, math.ceil(GUESS * k * s / len(base))))
    step = max(1, cap // s)
    w = [
        np.partition(_cdist(query[i : i + step], sample, dtype, workers), r - 1, axis=1)[:, r - 1]
        for i in range(0, len(query), step)
    ]  # (step, s) distances each
    return np.concatenate(w).astype(np.int64) + 1


def _blocks(lq, wq, ulen, rows_cap, order):
    """Split order (queries by length, guess) into runs of equal (length, guess), merged left to right
    while one cdist call over the merged length window is cheaper than two; a call costs
    (window size) * (rows + SETUP)."""
    m = len(lq)
    n_shorter = np.searchsorted(ulen, np.arange(lq[-1] + wq.max() + 2))  # (lengths,) strings shorter than each

    def cost(i, j):  # of the block order[i:j]
        wm = wq[i:j].max()
        return (n_shorter[lq[j - 1] + wm + 1] - n_shorter[max(lq[i] - wm, 0)]) * (j - i + SETUP)

    ends = np.flatnonzero(np.diff(lq) | np.diff(wq)) + 1
    runs = [min(x, e) for s, e in zip([0, *ends], [*ends, m]) for x in range(s + rows_cap, e + rows_cap, rows_cap)]
    bounds = [0]
    for a, e in zip(runs, runs[1:]):  # the block so far is order[bounds[-1]:a]; add the run order[a:e]?
        i = bounds[-1]
        if e - i > rows_cap or cost(i, e) > cost(i, a) + cost(a, e):
            bounds.append(a)
    return [order[i:j] for i, j in zip(bounds, [*bounds[1:], m])]


def _dists(qs, uniq, lo, hi, long_from, dtype, workers):
    """Distances of qs to uniq[lo:hi] as parts (offset, d, swapped).

    Strings of <= 64 chars go on cdist's SIMD side (its `queries`, so d is (strings, rows) and
    swapped): their set-up is paid once for the whole block. Longer ones (slow there) are the choices
    instead (d is (rows, strings)).
    """
    mid = min(max(long_from, lo), hi)
    parts = []
    if mid > lo:
        parts.append((lo, _cdist(uniq[lo:mid], qs, dtype, workers), True))
    if hi > mid:
        parts.append((mid, _cdist(qs, uniq[mid:hi], dtype, workers), False))
    return parts


def _select(parts, t, rows=slice(None)):
    """(row, distinct id, distance) triples with distance <= t[row], over the given rows of the block."""
    out = []
    for off, d, swapped in parts:
        if swapped:
            d = d[:, rows]  # (strings, rows)
            c, r = np.divmod(np.flatnonzero(d <= t), d.shape[1])
            out.append((r, c + off, d[c, r]))
        else:
            d = d[rows]  # (rows, strings)
            r, c = np.divmod(np.flatnonzero(d <= t[:, None]), d.shape[1])
            out.append((r, c + off, d[r, c]))
    return [np.concatenate(x) for x in zip(*out)]


def _kth(parts, rows, mult, k, top) -> np.ndarray:
    """(len(rows),) each row's K-th smallest distance over the parts, counting copies (top if < k)."""
    h = np.zeros((len(rows), top))
    for off, d, swapped in parts:
        wts = mult[off : off + d.shape[0 if swapped else 1]]
        for i, j in enumerate(rows):
            h[i] += np.bincount(d[:, j] if swapped else d[j], wts, minlength=top)
    return (np.cumsum(h, axis=1) < k).sum(axis=1)


def _topk(r, u, dd, nrows, groups, k):
    """Per row, the k nearest base strings among the selected (row, distinct id, distance) triples.

    Copies of a distinct string are expanded to all their base indices. Returns ok (nrows,) bool,
    rows with >= k selected base strings, and their dist, idx (ok.sum(), k).
    """
    members, offs = groups
    cnt = offs[u + 1] - offs[u]  # copies of each selected distinct string
    # drop what lies beyond each row's K-th distance (counting copies) before sorting and expanding
    nd = int(dd.max(initial=0)) + 1
    cum = np.bincount(r * nd + dd, cnt, minlength=nrows * nd).reshape(nrows, nd).cumsum(axis=1)
    keep = dd <= (cum < k).sum(axis=1)[r]
    r, u, dd, cnt = r[keep].astype(np.int16), u[keep], dd[keep], cnt[keep]  # rows < BLOCK
    o = np.argsort(dd, kind="stable")  # radix sorts: by row, then distance, then distinct id
    o = o[np.argsort(r[o], kind="stable")]
    r, u, dd, cnt = r[o], u[o], dd[o], cnt[o]
    b = members[np.repeat(offs[u], cnt) + np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt)]
    r, dd = np.repeat(r, cnt), np.repeat(dd, cnt)
    per_row = np.bincount(r, minlength=nrows)
    ok = per_row >= k
    take = (np.cumsum(per_row) - per_row)[ok][:, None] + np.arange(k)  # (ok rows, k)
    return ok, dd[take].astype(np.float64), b[take]


def topk_edit_exact(
    query: Sequence[str], base: Sequence[str], k: int, workers: int = -1, mem_cap_mb: int = 1024
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force oracle: all pairs through rapidfuzz cdist, chunked by rows; same outputs as topk_edit."""
    _check(query, base, k)
    m, n = len(query), len(base)
    step = max(1, (mem_cap_mb << 20) // (16 * n))
    dist, idx = np.empty((m, k)), np.empty((m, k), np.int64)
    for i in range(0, m, step):
        d = _cdist(query[i : i + step], base, np.int32, workers)  # (step, n)
        part = np.argpartition(d, k - 1, axis=1)[:, :k]
        pd = np.take_along_axis(d, part, axis=1)
        o = np.lexsort((part, pd), axis=1)
        dist[i : i + step], idx[i : i + step] = np.take_along_axis(pd, o, 1), np.take_along_axis(part, o, 1)
    return dist, idx


def tie_aware_recall(dist_approx: np.ndarray, dist_exact: np.ndarray) -> float:
    """Fraction of returned neighbours (all m*K) no farther than the exact K-th distance of their row."""
    return float(np.mean(dist_approx <= dist_exact[:, -1:]))
