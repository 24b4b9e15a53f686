"""The linkage metrics, one object each: what identifiers a metric links, how they
are checked, its exact and approximate searches, and what the privacy report attacks with it.

    metric(name) -> Metric                 the registered one; LinkageError naming the known ones
    Metric.kind                            "numbers" (m, d) float | "bits" (m, B) uint8 | "strings" (m,) / (m, c) str
    Metric.identifiers(arr, who) -> arr    the party's identifiers as the metric's array type, or LinkageError
    its exact top-K                        its kind's (linkage.exact.topk): k-d tree / matrix
                                           products, linkage.scorers by its ``exact``, linkage.hamming
    Metric.approx                          the approximate searches it has (linkage.approx.METHODS)
    Metric.auto(d) -> method               what search "auto" picks at scale (d: dimensions / bytes)
    Metric.coordinate_attacks(base) -> bool the privacy report's coordinate attacks apply (linkage.privacy)
    Metric.faiss, .exact, .scorer,         how linkage.approx, linkage.scorers and linkage.pairwise
      .sort_words, .integer, .p            search and score it (no module there tests a metric's name)
    Metric.norm(diff (.., d)) -> (..)      numbers: the metric's distance of difference vectors

Adding a metric: one entry in :data:`REGISTRY` (a numeric metric: its Minkowski order ``p``; a
string metric: its rapidfuzz ``scorer``, or a new exact search in linkage.scorers; a new kind of
identifier: its search in linkage.exact.topk too), plus tests; the names below (METRICS, STRING_METRICS, DEFAULT_STRING_METRIC) follow from it. This
module imports nothing heavy and nothing of the library but its error: linkage.contracts
re-exports its names in every message.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from linkage.errors import LinkageError

KINDS = ("numbers", "bits", "strings")


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str
    approx: tuple[str, ...] = ()  # the approximate searches it has, besides "exact" and "auto"
    auto_index: str = ""  # the index "auto" picks at scale ("": always exact)
    exact_up_to_dims: int = 0  # "auto" stays exact at d <= this (an exact k-d tree is fast there)
    coordinate_dims: int = 0  # the privacy report's coordinate attacks at d <= this (locations)
    label: str = ""  # its name in an error about its identifiers ("" = the name)
    faiss: str = ""  # its hnsw / ivf index (linkage.approx): "float" (L2 in float32, the candidates'
    #                  distances recomputed in float64 on the base), "binary" (popcounts, exact)
    exact: str = ""  # strings: its exact top-K (linkage.scorers): "edit" (length windows, linkage.strings),
    #                  "qgram" (q-gram cosine's inverted index, linkage.qgram), "" (brute force by ``scorer``)
    scorer: str = ""  # strings: its rapidfuzz distance, "Class.function" in rapidfuzz.distance ("": q-gram cosine)
    sort_words: bool = False  # strings: compared with their whitespace-separated words sorted
    integer: bool = False  # strings: its distances are integer counts (else float32, as rapidfuzz returns them)
    p: float = 2.0  # numbers: the Minkowski order of its distance, read by every search and score of
    #                 numbers (linkage.exact, linkage.search, linkage.pairwise): 2 Euclidean, 1 city-block,
    #                 inf the largest difference over the columns

    @property
    def strings(self) -> bool:
        return self.kind == "strings"

    def auto(self, d: int) -> str:
        """The search "auto" picks where the exact search is slow (linkage.approx.Approx.resolve)."""
        return "exact" if not self.auto_index or d <= self.exact_up_to_dims else self.auto_index

    def norm(self, diff: np.ndarray) -> np.ndarray:
        """numbers: the distance of difference vectors ``diff`` (.., d) -> (..), in float64."""
        if self.p == 2.0:
            return np.sqrt((diff * diff).sum(-1))  # the Euclidean arithmetic every search of old used
        return np.linalg.norm(diff, ord=self.p, axis=-1)

    def coordinate_attacks(self, base: np.ndarray) -> bool:
        """The coordinate attacks apply to these secondary identifiers (low-dimensional numbers)."""
        return self.coordinate_dims > 0 and base.ndim == 2 and base.shape[1] <= self.coordinate_dims

    def identifiers(self, ids, who: str) -> np.ndarray:
        """One party's identifiers as the metric's array type, refusing what does not fit."""
        arr = np.asarray(ids)
        if self.kind == "numbers":
            if arr.dtype.kind not in "fiu" or arr.ndim != 2:
                raise LinkageError(
                    f"{who}: {self.name} identifiers must be a 2-D numeric array (rows, dims); "
                    f"got dtype {arr.dtype} with shape {arr.shape}"
                )
            arr = arr.astype(np.float64, copy=False)
            bad = ~np.isfinite(arr).all(axis=1)
            if bad.any():
                raise LinkageError(
                    f"{who}: {int(bad.sum())} identifier row(s) are NaN/inf (first: {np.flatnonzero(bad)[:5].tolist()})"
                )
        elif self.kind == "strings":
            if arr.ndim not in (1, 2) or arr.dtype.kind not in "UO" or (arr.ndim == 2 and arr.shape[1] == 0):
                raise LinkageError(
                    f"{who}: {self.label or self.name} identifiers must be a 1-D array of strings "
                    f"(rows,) or a 2-D one (rows, columns); got dtype {arr.dtype} with shape {arr.shape}"
                )
            bad = np.array([not isinstance(s, str) for s in arr.ravel()], dtype=bool) if arr.dtype.kind == "O" else None
            if bad is not None and bad.any():
                rows = np.unique(np.flatnonzero(bad) // (arr.shape[1] if arr.ndim == 2 else 1))
                raise LinkageError(
                    f"{who}: {int(bad.sum())} identifier(s) are not strings (missing/NaN?) "
                    f"(first rows: {rows[:5].tolist()})"
                )
        elif arr.dtype != np.uint8 or arr.ndim != 2 or arr.shape[1] == 0:  # bits
            raise LinkageError(
                f"{who}: {self.name} identifiers must be packed bits, a 2-D uint8 array "
                f"(rows, bytes); got dtype {arr.dtype} with shape {arr.shape}"
            )
        return arr


_STRING = dict(kind="strings", approx=("qgram",), auto_index="qgram")
REGISTRY: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            "euclidean",
            "numbers",
            approx=("hnsw", "ivf"),
            auto_index="hnsw",
            exact_up_to_dims=8,
            coordinate_dims=3,
            faiss="float",
        ),
        # city-block distance (grid-aligned identifiers: a street grid, counts); exact search only
        # (faiss indexes L2), and no coordinate attacks (trilateration's geometry is Euclidean)
        Metric("manhattan", "numbers", p=1.0),
        # the largest difference over the columns (a record within x of another on every column
        # is within x): tolerances per column, e.g. a time and an amount; exact only, no coordinate attacks
        Metric("chebyshev", "numbers", p=float("inf")),
        # strings (linkage.scorers): raw Levenshtein and four normalised distances in [0, 1]
        Metric("edit", **_STRING, label="edit-distance", exact="edit", scorer="Levenshtein.distance", integer=True),
        Metric("levenshtein_norm", **_STRING, scorer="Levenshtein.normalized_distance"),
        Metric("jaro_winkler", **_STRING, scorer="JaroWinkler.normalized_distance"),
        Metric("token_sort", **_STRING, scorer="Indel.normalized_distance", sort_words=True),
        # its exact search is already an inverted index
        Metric("qgram_cosine", kind="strings", approx=("qgram",), exact="qgram"),
        Metric(
            "hamming", "bits", approx=("hnsw", "ivf"), auto_index="ivf", faiss="binary"
        ),  # packed Bloom / FEDERAL filters
    )
}
METRICS = tuple(REGISTRY)
STRING_METRICS = tuple(m.name for m in REGISTRY.values() if m.strings)
# The default: the best mean recall@1 and @10 over game titles and FEBRL4 names (+ address), and
# with trigrams 2.8x faster than raw Levenshtein at the game shape (docs/benchmarks.md, "String scorers")
DEFAULT_STRING_METRIC = "qgram_cosine"
DEFAULT_OF_KIND = {"numbers": "euclidean", "bits": "hamming", "strings": DEFAULT_STRING_METRIC}


def metric(name: str) -> Metric:
    """The registered metric of this name; LinkageError naming the known ones."""
    found = REGISTRY.get(name) if isinstance(name, str) else None
    if found is None:
        raise LinkageError(f"unknown metric {name!r}; known: {list(METRICS)}")
    return found
