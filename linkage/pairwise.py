"""Every distance between some query rows and some base rows, measured as linkage.search.search
measures them but without a top-K selection: what the dictionary attack (linkage.attacks) scores
each token's candidates on, a small (links x candidates) block per token.

    Pairwise(metric, query (m, ..), base (n, ..), query_rows (a,), base_rows (b,))
    pairwise(q (L,), c (C,)) -> (L, C) float64 distances, q and c drawn from query_rows / base_rows

Only the rows named up front are prepared (strings: their q-gram vectors, joined or word-sorted
forms), so a block costs its own size: no index is built and no thread pool started per block.
Distances equal the search's: Hamming counts of differing bits, Euclidean norms, q-gram cosine
distance 1 - dot / sqrt(|q|^2 |b|^2) on q-gram counts (linkage.qgram), and the rapidfuzz scorers
of linkage.scorers (float32 as there, edit as integer counts).
"""

from __future__ import annotations

import numpy as np
from rapidfuzz import process

from linkage.metrics import metric as metric_named
from linkage.scorers import PAD, QGRAM, joined, scorer, sort_tokens


def _words(bits) -> np.ndarray:
    """(rows, bytes) packed bits as (rows, words) uint64, zero-padded: popcounts a word at a time."""
    bits = np.asarray(bits, np.uint8).reshape(len(bits), -1)
    pad = -bits.shape[1] % 8
    return np.ascontiguousarray(np.pad(bits, ((0, 0), (0, pad)))).view(np.uint64)


class Pairwise:
    def __init__(self, metric: str, query, base, query_rows, base_rows) -> None:
        self.metric, self._how = metric, metric_named(metric)
        self._q_rows = np.unique(np.asarray(query_rows, np.int64))  # ascending: looked up by searchsorted
        self._b_rows = np.unique(np.asarray(base_rows, np.int64))
        q, b = np.asarray(query)[self._q_rows], np.asarray(base)[self._b_rows]
        if self._how.kind == "bits":
            self._q, self._b = _words(q), _words(b)
        elif self._how.kind == "numbers":
            self._q, self._b = np.asarray(q, np.float64), np.asarray(b, np.float64)
        else:
            self._strings(q, b)

    def _strings(self, q, b) -> None:
        qs, bs = joined(q) if len(q) else [], joined(b) if len(b) else []
        if self._how.exact == "qgram":
            from linkage.qgram import _counts, squares  # lazy: numba and scipy, for q-gram cosine only

            vocab: dict[str, int] = {}
            bm = _counts(bs, vocab, QGRAM, PAD)  # the base's q-grams first, as linkage.qgram.base_index
            qm = _counts(qs, vocab, QGRAM, PAD)  # a q-gram no base row has counts in the query's norm only
            self._b, self._b_sq = bm.tocsr(), squares(bm)
            self._q, self._q_sq = qm[:, : bm.shape[1]].tocsr(), squares(qm)
            return
        if self._how.sort_words:
            qs, bs = [sort_tokens(s) for s in qs], [sort_tokens(s) for s in bs]
        self._q, self._b = qs, bs

    def __call__(self, q_rows, b_rows) -> np.ndarray:
        qi = np.searchsorted(self._q_rows, np.asarray(q_rows, np.int64))
        bi = np.searchsorted(self._b_rows, np.asarray(b_rows, np.int64))
        if self._how.kind == "bits":
            return (
                np.bitwise_count(self._q[qi][:, None, :] ^ self._b[bi][None, :, :])
                .sum(-1, dtype=np.int64)
                .astype(np.float64)
            )
        if self._how.kind == "numbers":
            return self._how.norm(self._q[qi][:, None, :] - self._b[bi][None, :, :])  # (q, b)
        if self._how.exact == "qgram":
            dot = (self._q[qi] @ self._b[bi].T).toarray()
            return np.clip(1.0 - dot / np.sqrt(np.outer(self._q_sq[qi], self._b_sq[bi])), 0.0, 1.0)
        return self._rapidfuzz([self._q[i] for i in qi], [self._b[i] for i in bi])

    def _rapidfuzz(self, qs: list[str], bs: list[str]) -> np.ndarray:
        dtype = np.int32 if self._how.integer else np.float32  # edit: integer counts, as its search returns them
        return process.cdist(qs, bs, scorer=scorer(self.metric), dtype=dtype, workers=1).astype(np.float64)
