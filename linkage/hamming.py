"""Exact Hamming top-K on packed bit vectors (rows of np.packbits, uint8).

  topk_hamming(query (m, B), base (n, B), k)  -> dist (m, K) float64 ascending, idx (m, K) int64
  popcount_floor_seconds(query, base)          -> wall seconds of the cheapest exact all-pairs pass
                                                  (xor + popcount + compare, nothing kept)

Method: a numba kernel, queries split over threads. Per query, one pass over the base computes
popcount(q ^ b) on 64-bit words (LLVM emits vpopcnt/popcnt for the host CPU), storing the distance
and counting it in a histogram (distances are integers 0..bits); the K-th distance is read off the
histogram, and one more pass over the stored distances drops every row into its distance bucket, so
the output is sorted without a heap or a sort. The cost hardly depends on the data (no heap updates):
~1.5-1.7x the popcount floor at house shape (141,050 x 27,827 x 1024 bits, K = 100, 2 threads).
Why not faiss: on the same title Bloom filters IndexBinaryFlat took ~15x the floor with its heap top-K
(106 s) and ~5x with its counting variant (use_heap = False / knn_hamming(variant="mc"), 36 s).
Ties: Hamming distances are small integers; among equal distances the lower base row comes first.

Compiled kernels are cached in a user cache folder, not in the installed package's folder (which
may be read-only): $NUMBA_CACHE_DIR if set, else $XDG_CACHE_HOME/fedsim/numba or
~/.cache/fedsim/numba. The first job of a copy of this code compiles them (about 3 s on the 2-core
VM, docs/benchmarks.md; numba keys the cache by the source folder); :func:`warm` does it ahead.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable


def cache_dir() -> str:
    """Where numba caches this module's kernels: $NUMBA_CACHE_DIR, else the user's cache folder."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.environ["NUMBA_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "fedsim" / "numba")


os.environ.setdefault("NUMBA_CACHE_DIR", cache_dir())  # read by numba's config when numba is first imported

import numba  # noqa: E402 - after NUMBA_CACHE_DIR
import numpy as np  # noqa: E402
from numba import njit, prange, types  # noqa: E402
from numba.core import config as numba_config  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from linkage.contracts import LinkageError  # noqa: E402

if not numba_config.CACHE_DIR:  # numba was imported before this module: the decorators below still read it
    numba_config.CACHE_DIR = cache_dir()


@intrinsic
def _popcount(typingctx, x):  # llvm.ctpop.i64
    def codegen(context, builder, sig, args):
        return builder.ctpop(args[0])

    return types.uint64(types.uint64), codegen


@njit(inline="never", cache=True)
def _distances(q, i, b, dist, hist):  # dist (n,) <- popcount(q[i] ^ b[j]); hist (bits + 1,) their counts
    n, W = b.shape
    hist[:] = 0
    n4 = n - n % 4
    for j in range(0, n4, 4):  # 4 base rows at a time: independent sums keep the popcount units busy
        s0, s1, s2, s3 = 0, 0, 0, 0
        for w in range(W):
            x = q[i, w]
            s0 += _popcount(x ^ b[j, w])
            s1 += _popcount(x ^ b[j + 1, w])
            s2 += _popcount(x ^ b[j + 2, w])
            s3 += _popcount(x ^ b[j + 3, w])
        dist[j], dist[j + 1], dist[j + 2], dist[j + 3] = s0, s1, s2, s3
        hist[s0] += 1
        hist[s1] += 1
        hist[s2] += 1
        hist[s3] += 1
    for j in range(n4, n):
        s = 0
        for w in range(W):
            s += _popcount(q[i, w] ^ b[j, w])
        dist[j] = s
        hist[s] += 1


@njit(inline="never", cache=True)
def _select(dist, hist, k, out_d, out_i):  # the k smallest of dist, ascending, ties by row -> out (k,)
    cum, thr = 0, 0
    while cum + hist[thr] < k:  # thr = the k-th smallest distance
        cum += hist[thr]
        thr += 1
    off = 0
    for d in range(thr + 1):  # hist[d] <- first output slot of distance d
        h = hist[d]
        hist[d] = off
        off += h
    for j in range(dist.shape[0]):
        d = dist[j]
        if d <= thr:
            p = hist[d]
            if p < k:
                out_d[p] = d
                out_i[p] = j
                hist[d] = p + 1


@njit(parallel=True, cache=True)
def _topk_kernel(q, b, k, out_d, out_i):  # q (m, W), b (n, W) uint64 -> out_d (m, k) int32, out_i (m, k) int64
    m = q.shape[0]
    n, W = b.shape
    step = 16
    for c in prange((m + step - 1) // step):
        dist = np.empty(n, np.int32)
        hist = np.empty(W * 64 + 1, np.int64)
        for i in range(c * step, min(m, (c + 1) * step)):
            _distances(q, i, b, dist, hist)
            _select(dist, hist, k, out_d[i], out_i[i])


@njit(parallel=True, cache=True)
def _floor_count(q, b, thr):  # number of pairs with distance <= thr, counted in the loop
    m = q.shape[0]
    n, W = b.shape
    total = 0
    for i in prange(m):
        c = 0
        for j in range(n):
            s = 0
            for w in range(W):
                s += _popcount(q[i, w] ^ b[j, w])
            c += s <= thr
        total += c
    return total


@njit(parallel=True, cache=True)
def _floor_store(q, b, thr):  # same count, via a stored row of distances then a vector compare
    m = q.shape[0]
    n, W = b.shape
    step = 16
    total = 0
    for c in prange((m + step - 1) // step):
        dist = np.empty(n, np.int32)
        cnt = 0
        for i in range(c * step, min(m, (c + 1) * step)):
            for j in range(n):
                s = 0
                for w in range(W):
                    s += _popcount(q[i, w] ^ b[j, w])
                dist[j] = s
            for j in range(n):
                cnt += dist[j] <= thr
        total += cnt
    return total


def _as_words(x: np.ndarray, who: str, width: int | None = None) -> np.ndarray:
    """(rows, B) uint8 packed bits -> (rows, ceil(B / 8)) uint64, zero-padded (padding adds no distance)."""
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2:
        raise LinkageError(
            f"{who}: packed bit vectors must be a 2-D uint8 array (rows, bytes); "
            f"got {type(x).__name__} {getattr(x, 'dtype', '')} {getattr(x, 'shape', '')}"
        )
    if len(x) == 0 or x.shape[1] == 0:
        raise LinkageError(f"{who}: empty bit vectors, shape {x.shape}")
    if width is not None and x.shape[1] != width:
        raise LinkageError(f"bytes per filter differ: query has {width}, {who} has {x.shape[1]}")
    B = x.shape[1]
    if B % 8:
        x = np.concatenate([x, np.zeros((len(x), 8 - B % 8), np.uint8)], axis=1)
    return np.ascontiguousarray(x).view(np.uint64)


def topk_hamming(
    query: np.ndarray,
    base: np.ndarray,
    k: int,
    *,
    mem_cap_mb: float = 1024,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k by Hamming distance: query (m, B), base (n, B) uint8 -> dist (m, k) float64, idx (m, k) int64.

    Queries run in blocks whose int32 distance scratch fits mem_cap_mb (and at most 8192 rows, so that
    ``progress(done_rows, m)`` is called every few seconds). Working memory beyond inputs and outputs:
    ~n * 4 B per thread plus one block.
    """
    q = _as_words(query, "query")
    b = _as_words(base, "base", width=query.shape[1])
    m, n = len(q), len(b)
    if not 1 <= k <= n:
        raise LinkageError(f"K={k} must be between 1 and the number of base rows ({n})")
    block = int(max(1, min(m, 8192, mem_cap_mb * 2**20 // (12 * k))))
    dist = np.empty((m, k), np.float64)
    idx = np.empty((m, k), np.int64)
    out_d = np.empty((block, k), np.int32)
    for r0 in range(0, m, block):
        r1 = min(m, r0 + block)
        _topk_kernel(q[r0:r1], b, k, out_d[: r1 - r0], idx[r0:r1])
        dist[r0:r1] = out_d[: r1 - r0]
        if progress is not None:
            progress(r1, m)
    return dist, idx


def popcount_floor_seconds(query: np.ndarray, base: np.ndarray, repeats: int = 1) -> float:
    """Wall seconds of the cheapest exact all-pairs xor + popcount + compare pass over query x base.

    Runs two variants of the pass (count in the loop; store a row then compare) ``repeats`` times each
    after a small warm-up and returns the fastest: the floor any exact top-K must pay on these threads.
    """
    q = _as_words(query, "query")
    b = _as_words(base, "base", width=query.shape[1])
    best = float("inf")
    for fn in (_floor_count, _floor_store):
        fn(q[:2], b[:2], 0)  # compile / load from cache
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(q, b, 0)
            best = min(best, time.perf_counter() - t0)
    return best


def warm() -> float:
    """Compile the top-K kernel (or load it from the cache) on a tiny input; returns the seconds
    it took. ``python -c "from linkage.hamming import warm; warm()"`` spares the first job the wait."""
    t0 = time.perf_counter()
    bits = np.zeros((2, 8), np.uint8)
    topk_hamming(bits, bits, 1)
    return time.perf_counter() - t0


def num_threads() -> int:
    """Threads the kernels use (numba's; set NUMBA_NUM_THREADS or numba.set_num_threads to change)."""
    return numba.get_num_threads()
