"""Approximate top-K with faiss, behind the exact search's contract, and the tie-aware
recall every approximate result reports.

    Approx(method, recall_floor, sample, ...)           how a job searches (method "exact": as before)
    approx_topk(metric, query (m, ..), base (n, ..), k, approx) -> dist (m, k) float64, idx (m, k) int64
    approx_searcher(metric, base, k, approx) -> q (c, ..) -> (dist (c, k), idx (c, k)), one index built once
    approx_chunks(metric, query, base, k, approx, rows) -> (lo, dist (c, k), idx (c, k)) per chunk, one index
    tie_aware_recall(metric, query, base, k, dist (m, k), rows (s,)) -> float in [0, 1]

Euclidean: faiss HNSW (IndexHNSWFlat) or IVF (IndexIVFFlat); the returned candidates' distances
are recomputed in float64 and re-sorted, so every distance is exact and only *which* neighbours
were found can differ from the exact search. Hamming (packed Bloom / FEDERAL filters): faiss
binary HNSW or IVF, whose distances are exact popcounts. Strings have no approximate path yet.

Recall is tie-aware: a returned neighbour counts as correct when its distance is at most the
exact k-th distance of its record (any of several rows at that distance is a right answer).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from rapidfuzz import process

from linkage.contracts import LinkageError
from linkage.metrics import metric as metric_named
from linkage.scorers import PAD, QGRAM, joined, scorer, sort_tokens

METHODS = ("exact", "hnsw", "ivf", "qgram", "auto")
# "auto" searches approximately only where the exact search is slow: beyond this many (record,
# candidate) pairs (1M x 1M 1024-bit exact: ~25 min on 2 cores, docs/benchmarks.md) Hamming by
# IVF (1M x 1M: recall 0.9999 at nprobe 4 where the binary HNSW reached 0.955), Euclidean above 8
# dimensions by HNSW (at <= 8 the exact k-d tree stays fast: 1M x 1M in 12 s), strings (but
# qgram_cosine, whose exact search is already an inverted index) by q-gram candidates

AUTO_PAIRS = 10**10


@dataclass(frozen=True)
class Approx:
    """An approximate search and the recall it must reach.

    method:        "exact" (no index), "hnsw" or "ivf" (faiss; numbers and filters), "qgram"
                   (strings: q-gram cosine candidates, reranked by the job's metric), "auto"
                   (:meth:`resolve`).
    candidates:    qgram: candidates per record before the rerank (0 = max(4 K, 100)).
    recall_floor:  the job refuses to finish when the tie-aware recall on ``sample`` records
                   falls below it (0 = report only).
    sample:        records whose exact top-K is computed to measure the recall.
    hnsw_m, ef_search, ef_construction: HNSW's graph degree and search / build beam widths.
    nlist, nprobe: IVF's cells (0 = about 4 sqrt(n); Hamming: sqrt(n)) and the cells searched per record.
    """

    method: str = "exact"
    recall_floor: float = 0.0
    sample: int = 1000
    hnsw_m: int = 32
    ef_search: int = 128
    ef_construction: int = 80
    nlist: int = 0
    nprobe: int = 16
    candidates: int = 0

    def resolve(self, metric: str, m: int, n: int, d: int) -> "Approx":
        """ "auto" made concrete for a search of m records among n of d dimensions (bytes for
        Hamming): an index where the exact search is slow (AUTO_PAIRS), else "exact"."""
        if self.method != "auto":
            return self
        method = "exact" if m * n <= AUTO_PAIRS else metric_named(metric).auto(d)  # each metric's index at scale
        return Approx(**{**self.__dict__, "method": method})

    def tag(self) -> str:
        """Its part of a job's content id: '' when exact (ids of earlier jobs unchanged)."""
        if self.method == "exact":
            return ""
        knobs = {
            "hnsw": (self.hnsw_m, self.ef_search, self.ef_construction),
            "ivf": (self.nlist, self.nprobe),
            "qgram": (self.candidates,),
        }.get(self.method) or (
            self.hnsw_m,
            self.ef_search,
            self.ef_construction,
            self.nlist,
            self.nprobe,
            self.candidates,
        )
        return f"|{self.method}{knobs}"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise LinkageError(f"unknown search method {self.method!r}; known: {list(METHODS)}")
        if not 0.0 <= self.recall_floor <= 1.0:
            raise LinkageError(f"the recall floor must be in [0, 1], got {self.recall_floor}")
        if min(self.sample, self.hnsw_m, self.ef_search, self.ef_construction, self.nprobe) < 1 or self.nlist < 0:
            raise LinkageError(f"approximate search parameters must be positive: {self}")


def _nlist(n: int, approx: Approx, per_root: float = 4.0) -> int:
    """IVF cells: the given number (at most n), else about per_root sqrt(n), >= 39 points per cell."""
    if approx.nlist > n:
        raise LinkageError(f"nlist={approx.nlist} IVF cells for {n} secondary records: at most one cell per record")
    return approx.nlist or max(1, min(n // 39, int(per_root * np.sqrt(n))))


def _float_index(d: int, n: int, approx: Approx):
    import faiss

    if approx.method == "hnsw":
        index = faiss.IndexHNSWFlat(d, approx.hnsw_m)
        index.hnsw.efConstruction = approx.ef_construction
        return index
    return faiss.IndexIVFFlat(faiss.IndexFlatL2(d), d, _nlist(n, approx))


def _binary_index(bits: int, n: int, approx: Approx):
    import faiss

    if approx.method == "hnsw":
        index = faiss.IndexBinaryHNSW(bits, approx.hnsw_m)
        index.hnsw.efConstruction = approx.ef_construction  # faiss's own default (40) before 2026-11-24
        return index
    # sqrt(n) cells, not 4 sqrt(n): faiss trains a binary IVF by k-means on the bits as floats (d =
    # bits), cost ~ cells^2 d; 1M x 1M 1024-bit, 1,024 cells: 53 s to build, recall 0.9999 at
    # nprobe 4; 4,000 cells would take ~15x that to train (docs/benchmarks.md)
    return faiss.IndexBinaryIVF(faiss.IndexBinaryFlat(bits), bits, _nlist(n, approx, per_root=1.0))


def _fill(index, data: np.ndarray) -> None:
    """Train (IVF: on a seeded sample of 64 points per cell, as faiss's k-means would subsample),
    then add the base."""
    if not index.is_trained:
        n_train = min(len(data), 64 * index.nlist)
        # a fixed seed is safe here: which base points train the index protects no party (the
        # release's randomness comes from the job's secret, linkage/noise.py)
        rows = np.sort(np.random.default_rng(0).choice(len(data), n_train, replace=False))
        index.train(np.ascontiguousarray(data[rows]))
    index.add(data)


def _query(index, query: np.ndarray, k: int, approx: Approx) -> tuple[np.ndarray, np.ndarray]:
    """Set the search width, search: (m, k) faiss distances and candidate rows (-1 = none)."""
    if approx.method == "hnsw":
        index.hnsw.efSearch = max(approx.ef_search, k)
    else:
        index.nprobe = min(approx.nprobe, index.nlist)
    dist, cand = index.search(query, k)
    return dist, cand.astype(np.int64)


def _euclidean(q: np.ndarray, b: np.ndarray, cand: np.ndarray, budget: int = 1 << 27) -> np.ndarray:
    """(m, k) float64 distances of q (m, d) to its candidates b[cand], in row chunks of at most
    ``budget`` bytes of differences."""
    out = np.empty(cand.shape)
    chunk = max(1, budget // (8 * cand.shape[1] * q.shape[1]))
    for lo in range(0, len(q), chunk):
        c = cand[lo : lo + chunk]
        out[lo : lo + chunk] = np.linalg.norm(q[lo : lo + chunk, None, :] - b[np.maximum(c, 0)], axis=2)
    return out


def _empty_index(metric: str, base: np.ndarray, approx: Approx):
    """The metric's faiss index for ``base``, not yet trained or filled (linkage.metrics: Metric.faiss)."""
    faiss = metric_named(metric).faiss
    if faiss == "float":
        return _float_index(base.shape[1], len(base), approx)
    if faiss == "binary":
        return _binary_index(base.shape[1] * 8, len(base), approx)
    raise LinkageError(f"no approximate search for metric {metric!r} (euclidean and hamming have one)")


def approx_searcher(metric: str, base, k: int, approx: Approx):
    """A function q (c, ..) -> (dist (c, k), idx (c, k)): one index over the base, built here,
    serving every call (a job in memory, linkage.runner: one call; the service: one call per chunk of its records,
    here or, pickled once into Ray's object store, in Ray's workers)."""
    if approx.method == "qgram":
        return _qgram_searcher(metric, base, k, approx.candidates or max(4 * k, 100))
    if approx.method not in ("hnsw", "ivf"):
        raise LinkageError(f"approximate search method {approx.method!r} is not an index")
    base = np.asarray(base)
    search = IndexSearch(metric, base, k, approx, _empty_index(metric, base, approx))
    _fill(search.index, search.prepare(base))  # the base as the index's input: the queries' own preparation
    return search


class IndexSearch:
    """A faiss index over a base, called per chunk of queries. Euclidean: faiss works in float32,
    so queries are centred first (as the exact path does) and the candidates' distances
    recomputed in float64 on the base; Hamming: faiss's popcounts are exact. Pickles (for Ray)
    as the index's own serialisation, which faiss's binary indexes lack."""

    def __init__(self, metric: str, base, k: int, approx: Approx, index) -> None:
        self.metric, self.base, self.k, self.approx, self.index = metric, base, k, approx, index
        self._float = metric_named(metric).faiss == "float"  # else binary
        if self._float:
            self.base = np.asarray(base, np.float64)
            self._shift = self.base.mean(axis=0)

    def prepare(self, q) -> np.ndarray:
        """The queries as the index takes them."""
        if self._float:
            return np.ascontiguousarray(np.asarray(q, np.float64) - self._shift, np.float32)
        return np.ascontiguousarray(q, np.uint8)

    def __call__(self, q) -> tuple[np.ndarray, np.ndarray]:
        d, cand = _query(self.index, self.prepare(q), self.k, self.approx)  # (c, k) each
        if self._float:
            d = _euclidean(np.asarray(q, np.float64), self.base, cand)
        return _sorted(d.astype(np.float64, copy=False), cand, self.k, self.approx)

    def __reduce__(self):
        import faiss

        binary = not self._float
        data = (faiss.serialize_index_binary if binary else faiss.serialize_index)(self.index)  # (bytes,) uint8
        base = None if binary else self.base  # a binary index holds the filters; Euclidean reranks on the base
        return _unpickled, (self.metric, base, self.k, self.approx, data)


def _unpickled(metric: str, base, k: int, approx: Approx, data: np.ndarray) -> IndexSearch:
    import faiss

    binary = metric_named(metric).faiss == "binary"
    index = (faiss.deserialize_index_binary if binary else faiss.deserialize_index)(data)
    return IndexSearch(metric, base, k, approx, index)


def approx_chunks(metric: str, query, base, k: int, approx: Approx, rows: int = 0):
    """Yield (lo, dist (c, k), idx (c, k)) for query rows lo .. lo + c, chunks of ``rows`` rows
    (0 = one chunk), one index over the base serving them all: a caller that writes each chunk
    away holds one chunk's output, not m rows' (approx_topk: all rows in one call)."""
    step = rows or max(1, len(query))
    find = approx_searcher(metric, base, k, approx)
    for lo in range(0, len(query), step):
        yield lo, *find(query[lo : lo + step])


def _sorted(dist: np.ndarray, cand: np.ndarray, k: int, approx: Approx) -> tuple[np.ndarray, np.ndarray]:
    """Refused when the index found fewer than K for a record; else by distance, ties by row."""
    ok = cand >= 0
    if not ok.all():
        raise LinkageError(
            f"the {approx.method} index found fewer than K={k} neighbours for "
            f"{int((~ok.all(axis=1)).sum())} record(s); raise ef_search / nprobe or search exactly"
        )
    order = np.lexsort((cand, dist), axis=1)  # by distance, ties by row: as the exact search orders them
    return np.take_along_axis(dist, order, 1), np.take_along_axis(cand, order, 1)


def approx_topk(metric: str, query, base, k: int, approx: Approx) -> tuple[np.ndarray, np.ndarray]:
    """The K nearest base rows of each query row found by the approximate index: distances
    exact (Euclidean recomputed in float64; Hamming: faiss's own popcounts), ascending; refused
    when the index found fewer than K for a record."""
    return approx_searcher(metric, base, k, approx)(query)


def _qgram_searcher(metric: str, base, k: int, c: int):
    """Strings: query -> the c nearest by q-gram cosine (linkage.qgram's inverted index: work
    along posting lists, not m x n) as candidates, each scored by the job's metric, the K best
    kept. The base's strings, scorer input and index are made once, for every chunk of queries."""
    from linkage.qgram import base_index, topk_cosine  # lazy: numba and scipy, for string jobs only

    how = metric_named(metric)
    if not how.strings:
        raise LinkageError(f"the qgram search is for strings, not metric {metric!r}")
    b = joined(base)
    index = base_index(b, QGRAM, PAD)
    if how.exact == "qgram":  # its exact search is the inverted index itself
        return lambda query: topk_cosine(joined(query), b, k, q=QGRAM, pad=PAD, index=index)
    c, b_arr = min(max(c, k), len(b)), scorer_input(metric, b)

    def find(query) -> tuple[np.ndarray, np.ndarray]:
        q = joined(query)
        _, cand = topk_cosine(q, b, c, q=QGRAM, pad=PAD, index=index)  # (m, c)
        q_arr = scorer_input(metric, q)
        dist, idx = np.empty((len(q), k)), np.empty((len(q), k), np.int64)
        for lo in range(0, len(q), 1 << 14):  # row chunks: O(chunk c) pairs at once
            cc = cand[lo : lo + (1 << 14)]
            d = candidate_distances(metric, q_arr[lo : lo + len(cc)], b_arr, cc)
            order = np.lexsort((cc, d), axis=1)[:, :k]
            dist[lo : lo + len(cc)], idx[lo : lo + len(cc)] = (
                np.take_along_axis(d, order, 1),
                np.take_along_axis(cc, order, 1),
            )
        return dist, idx

    return find


def scorer_input(metric: str, strings: list[str]) -> np.ndarray:
    """(n,) object array of joined strings as the metric's scorer compares them (token_sort:
    each string's words sorted, as linkage.scorers does)."""
    return np.array([sort_tokens(x) for x in strings] if metric_named(metric).sort_words else strings, dtype=object)


def candidate_distances(metric: str, q: np.ndarray, b: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """(r, c) the metric's distance of each query string q (r,) to its candidates b[cand] (cand
    (r, c)), both from :func:`scorer_input`, in the exact search's precision (float32 for the
    normalised scorers), as float64."""
    dtype = (
        np.float64 if metric_named(metric).integer else np.float32
    )  # as linkage.scorers / linkage.strings return them
    pairs = process.cpdist(np.repeat(q, cand.shape[1]), b[cand.ravel()], scorer=scorer(metric), dtype=dtype, workers=-1)
    return pairs.astype(np.float64).reshape(cand.shape)


def tie_aware_recall(metric: str, query, base, k: int, dist: np.ndarray, rows: np.ndarray) -> float:
    """Share of the returned neighbours of records ``rows`` (s,) whose distance dist (m, K) is
    at most the exact K-th distance of their record: the exact search on those records only,
    its K neighbours' distances recomputed as the approximate path computes them (float64 norms;
    the string scorers' own precision), so two arithmetics never tell equal neighbours apart."""
    from linkage.exact import topk  # lazy: scipy, for the recall check only (linkage.job imports this module)

    rows = np.asarray(rows, np.int64)
    q = np.asarray(query)[rows]
    exact_d, exact_i = topk(metric, q, base, k)  # (s, K)
    how = metric_named(metric)
    if how.faiss == "float":
        exact_d = _euclidean(np.asarray(q, np.float64), np.asarray(base, np.float64), exact_i)
    elif how.strings and not how.exact:  # the brute-force scorers (float32): popcounts, edit, q-gram cosine agree
        exact_d = candidate_distances(
            metric, scorer_input(metric, joined(q)), scorer_input(metric, joined(base)), exact_i
        )
    kth = exact_d.max(axis=1, keepdims=True)  # (s, 1)
    tol = 1e-12 * np.maximum(np.abs(kth), 1.0)
    return float((dist[rows] <= kth + tol).mean())


def sample_rows(m: int, approx: Approx, secret: bytes, party: str) -> np.ndarray:
    """(s,) the records whose recall is measured: all when m <= sample, else a draw keyed by the
    job's secret and the party (linkage.job_secret), which no party knows: a sample anyone could
    compute from m would let a crafted upload be easy exactly there and pass the recall floor."""
    if m <= approx.sample:
        return np.arange(m)
    digest = hashlib.sha256(b"fedsim-recall-sample|" + party.encode() + b"|" + bytes(secret)).digest()
    rng = np.random.default_rng(np.frombuffer(digest, dtype=np.uint32))
    return np.sort(rng.choice(m, approx.sample, replace=False))
