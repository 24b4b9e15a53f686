"""Exact top-K by q-gram cosine: 1 - cos(character q-gram count vectors), q = linkage.scorers.QGRAM.

  topk_cosine(query (m,) str, base (n,) str, k)  -> dist (m, K) float64 ascending, idx (m, K) int64

Method: the base becomes an inverted index (q-gram -> the base rows holding it, with their counts;
kept for the last base, which a service job searches once per chunk of queries), each query a
sparse q-gram count vector over the same vocabulary. A numba
kernel (nogil; slices of queries on a thread pool, which compiles in a few seconds where a
``parallel=True`` kernel took ten) accumulates each query's dot products along its q-grams'
posting lists into a dense (n,) scratch row, remembering which rows it touched (only those can be
closer than distance 1), divides them by the norms (sqrt of |q|^2 |b|^2, so equal strings are at
exactly 0), then keeps the k largest by a 1024-bucket histogram of the touched values
and a sort of the few rows in and above the K-th bucket, and zeroes what it touched. The work is
the posting lists' lengths, not m x n: at the game shape (26,987 x 439,999 titles) with trigrams
about 4 G multiply-adds, with bigrams about 15 G. A base row sharing no q-gram is at distance 1;
ties (equal distances) come in base-row order. The kernels are cached where linkage.hamming's are
(the user's cache folder); :func:`warm` compiles them ahead of the first job.
"""

from __future__ import annotations

import hashlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
from numba import njit
from scipy import sparse

import linkage.hamming  # first: numba's cache in the user's cache folder (linkage.hamming.cache_dir)

BUCKETS = 1024  # histogram resolution of the selection (any value works: it only bounds the sort)
STEP = 64  # queries per kernel call (a thread's unit of work)
_LAST: dict = {}  # the last base's index (base_index)
_LOCK = threading.Lock()


def qgrams(s: str, q: int, pad: str) -> list[str]:
    """The padded string's q-grams, with repeats (their counts make the vectors)."""
    s = pad * (q - 1) + s + pad * (q - 1)
    return [s[i : i + q] for i in range(len(s) - q + 1)]


def _counts(strings: list[str], vocab: dict[str, int], q: int, pad: str) -> sparse.csr_matrix:
    """(len(strings), V) q-gram counts, float64; q-grams not in ``vocab`` are added to it."""
    ids, ptr = [], [0]
    for s in strings:
        ids.extend(vocab.setdefault(g, len(vocab)) for g in qgrams(s, q, pad))
        ptr.append(len(ids))
    mat = sparse.csr_matrix(
        (np.ones(len(ids)), np.asarray(ids, np.int64), np.asarray(ptr, np.int64)), shape=(len(strings), len(vocab))
    )
    mat.sum_duplicates()  # repeated q-grams -> counts
    return mat


def squares(mat: sparse.csr_matrix) -> np.ndarray:
    """(rows,) each row's sum of squared counts (> 0: a padded string has a q-gram)."""
    return np.asarray(mat.multiply(mat).sum(axis=1), np.float64).ravel()


def _digest(strings: list[str]) -> str:
    lengths = np.fromiter(map(len, strings), np.int64, len(strings))
    return hashlib.sha256(lengths.tobytes() + "".join(strings).encode("utf-8", "surrogatepass")).hexdigest()


def base_index(base: list[str], q: int, pad: str) -> tuple:
    """The base's q-gram vocabulary, inverted index (q-gram -> base rows, counts) and squared norms.
    The last base's is kept: a service job searches one base chunk by chunk of queries."""
    key = (q, pad, len(base), _digest(base))
    with _LOCK:
        if _LAST.get("key") == key:
            return _LAST["index"]
    vocab: dict[str, int] = {}
    counts = _counts(base, vocab, q, pad)  # (n, V)
    inv = counts.T.tocsr()  # (V, n)
    index = (vocab, inv.indptr.astype(np.int64), inv.indices.astype(np.int64), inv.data, squares(counts))
    with _LOCK:
        _LAST.clear()
        _LAST.update(key=key, index=index)
    return index


def cosines(query: list[str], base: list[str], q: int, pad: str) -> np.ndarray:
    """(m, n) all cosines as a dense matrix: for small inputs (checks, the benchmark's column means)."""
    vocab, ptr, idx, val, b_sq = base_index(base, q, pad)
    qv = _counts(query, dict(vocab), q, pad)
    dot = (qv[:, : len(ptr) - 1] @ sparse.csr_matrix((val, idx, ptr), shape=(len(ptr) - 1, len(base)))).toarray()
    return dot / np.sqrt(np.outer(squares(qv), b_sq))


@njit(nogil=True, cache=True)
def _cut(vals, nt, k, hist):  # the lowest histogram bucket holding one of the k largest of vals[:nt]
    hist[:] = 0
    for t in range(nt):
        hist[min(int(vals[t] * BUCKETS), BUCKETS)] += 1
    cut, seen = BUCKETS, hist[BUCKETS]
    while seen < k and cut > 0:
        cut -= 1
        seen += hist[cut]
    return cut if seen >= k else 0


@njit(nogil=True, cache=True)
def _order(r, v, c):  # indices of r[:c], v[:c] by v descending, then r ascending: a bottom-up merge sort
    o, tmp = np.empty(c, np.int64), np.empty(c, np.int64)  # (plain loops: numba compiles them far faster
    for t in range(c):  # than np.sort / np.argsort, which cost about a second each on the first job)
        o[t] = t
    width = 1
    while width < c:
        for lo in range(0, c, 2 * width):
            mid, hi = min(lo + width, c), min(lo + 2 * width, c)
            a, b, t = lo, mid, lo
            while a < mid and b < hi:
                x, y = o[a], o[b]
                if v[x] > v[y] or (v[x] == v[y] and r[x] < r[y]):
                    tmp[t], a = x, a + 1
                else:
                    tmp[t], b = y, b + 1
                t += 1
            for x in range(a, mid):
                tmp[t], t = o[x], t + 1
            for y in range(b, hi):
                tmp[t], t = o[y], t + 1
        o, tmp = tmp, o
        width *= 2
    return o


@njit(nogil=True, cache=True)
def _select(vals, rows, nt, k, hist, out_d, out_i, i):  # out row i <- the k largest vals[:nt], ties by row
    cut = _cut(vals, nt, k, hist) if nt > k else 0  # keep what lies in or above the k-th's bucket
    keep_r, keep_v = np.empty(nt, np.int64), np.empty(nt, np.float64)
    c = 0
    for t in range(nt):
        if min(int(vals[t] * BUCKETS), BUCKETS) >= cut:
            keep_r[c], keep_v[c] = rows[t], vals[t]
            c += 1
    order = _order(keep_r, keep_v, c)
    take = min(k, c)
    for t in range(take):
        out_i[i, t] = keep_r[order[t]]
        out_d[i, t] = min(max(1.0 - keep_v[order[t]], 0.0), 1.0)
    if take < k:  # fewer than k base rows share a q-gram: the lowest other rows follow, at distance 1
        shared = np.zeros(k + nt, np.bool_)  # the rows wanted all lie below k + nt
        for t in range(nt):
            if rows[t] < k + nt:
                shared[rows[t]] = True
        j = 0
        for t in range(take, k):
            while shared[j]:
                j += 1
            out_i[i, t], out_d[i, t] = j, 1.0
            j += 1


@njit(nogil=True, cache=True)
def _topk_rows(q_ptr, q_idx, q_val, q_sq, b_ptr, b_idx, b_val, b_sq, k, lo, hi, out_d, out_i):
    """Queries lo..hi: out_d, out_i (m, k) rows lo..hi. Holds no GIL: threads run it side by side."""
    n, nv = len(b_sq), len(b_ptr) - 1
    acc = np.zeros(n, np.float64)  # dot products (of counts: exact) of the query, zero where untouched
    rows = np.empty(n, np.int64)  # the base rows it touched, in touch order
    vals = np.empty(n, np.float64)  # their cosines, read out (and acc zeroed) in one pass
    hist = np.empty(BUCKETS + 1, np.int64)
    for i in range(lo, hi):
        nt = 0
        for p in range(q_ptr[i], q_ptr[i + 1]):
            g, w = q_idx[p], q_val[p]
            if g >= nv:  # a q-gram no base string has (counted in the query's norm only)
                continue
            for r in range(b_ptr[g], b_ptr[g + 1]):
                j = b_idx[r]
                if acc[j] == 0.0:  # weights are > 0: a row is touched once
                    rows[nt] = j
                    nt += 1
                acc[j] += w * b_val[r]
        for t in range(nt):  # cosine = dot / sqrt(|q|^2 |b|^2): exactly 1 for equal strings
            vals[t] = acc[rows[t]] / np.sqrt(q_sq[i] * b_sq[rows[t]])
            acc[rows[t]] = 0.0
        _select(vals, rows, nt, k, hist, out_d, out_i, i)


def topk_cosine(
    query: list[str],
    base: list[str],
    k: int,
    *,
    q: int,
    pad: str,
    progress: Callable[[int, int], None] | None = None,
    index: tuple | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact k nearest base strings of each query string by q-gram cosine distance (module docstring).
    Slices of STEP queries go to linkage.hamming.num_threads() threads. ``index``: the base's
    :func:`base_index`, when the caller built it once for many calls."""
    vocab, *postings, b_sq = index or base_index(base, q, pad)
    qv = _counts(query, dict(vocab), q, pad)  # (m, V'): the base's q-grams first, then the query's own
    args = (qv.indptr.astype(np.int64), qv.indices.astype(np.int64), qv.data, squares(qv), *postings, b_sq, k)
    m = len(query)
    dist, idx = np.empty((m, k)), np.empty((m, k), np.int64)
    with ThreadPoolExecutor(linkage.hamming.num_threads()) as pool:
        jobs = [pool.submit(_topk_rows, *args, lo, min(m, lo + STEP), dist, idx) for lo in range(0, m, STEP)]
        for done, job in enumerate(jobs, 1):
            job.result()
            if progress and (done % 64 == 0 or done == len(jobs)):
                progress(min(m, done * STEP), m)
    return dist, idx


def warm() -> float:
    """Compile the kernels (or load them from the cache) on a tiny input; returns the seconds it took."""
    t0 = time.perf_counter()
    topk_cosine(["ab"], ["ab", "cd"], 2, q=3, pad="_")
    return time.perf_counter() - t0
