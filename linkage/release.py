"""The release: a noise-free top-K search turned into what the parties receive, in memory or by chunks.

    similarity(dist (m, P))                    -> raw sim (m, P) = -dist
    standardise(sims, m, rows)                 -> (mean, std) over the given rows' P similarities
    plan_party(party, chunks, m, n, ...)       -> PartyPlan: a party's statistics, sigma and tokens
    PartyPlan.rows(dist (c, P), idx (c, P), secret, ids (c, ..)) -> tokens (c, K), sims (c, K) float32
    release(neighbours, sizes, ...)            -> LinkageResult (every party's (m, P) arrays at once)

``chunks`` is a function returning a fresh iterator of (lo, dist (c, P), idx (c, P)) over the primary
rows in order: one chunk for an in-memory search, the service's finished chunk files for a job too
big to hold (linkage_server.release_files). Every step is row-wise or a sum of per-row sums, and
the noise of a record is keyed by its identifiers, so a chunked release equals the in-memory one
bit for bit whatever the chunks (tests/test_release_stream.py). Every random draw comes from the
job's secret, which only the linkage service holds (linkage.job_secret): token permutations from
:func:`rng_from_secret`, the noise from :func:`linkage.noise.record_noise`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from linkage.contracts import (
    Defences,
    LinkageError,
    LinkageResult,
    PartyLink,
    PrimaryLinkage,
    SecondaryLinkage,
)
from linkage.noise import dp_sigma, record_noise, sigma_from_tau

Chunks = Callable[[], Iterable[tuple[int, np.ndarray, np.ndarray]]]  # () -> (lo, dist (c, P), idx (c, P)), ...


def similarity(dist: np.ndarray) -> np.ndarray:
    """-distance, for every metric: the standardisation that follows removes the scale, so a
    [0, 1] distance (the normalised string metrics) and a count (edit, hamming) alike become a
    similarity of mean 0 and std 1 over the training records' candidates."""
    return -dist


def standardise(sims: Callable[[], Iterable[tuple[int, np.ndarray]]], m: int, rows: np.ndarray) -> tuple[float, float]:
    """(mean, std) of the similarities of records ``rows`` (repeats count again), from chunks
    (lo, sim (c, P)) of m records: per-row sums, then their sum, in two passes (mean, then the
    squared deviations), so the figures do not depend on how the rows were chunked."""
    rows, per_row, width = np.asarray(rows, np.int64), np.zeros(m), 0
    for lo, sim in sims():
        per_row[lo:lo + len(sim)], width = np.ascontiguousarray(sim, np.float64).sum(1), sim.shape[1]
    count = len(rows) * width
    mean = float(per_row[rows].sum() / count)
    for lo, sim in sims():
        per_row[lo:lo + len(sim)] = np.square(np.ascontiguousarray(sim, np.float64) - mean).sum(1)
    std = math.sqrt(float(per_row[rows].sum() / count))
    return mean, (std if std > 0 else 1.0)


def fit_standardizer(sim: np.ndarray, rows: np.ndarray) -> tuple[float, float]:
    """(mean, std) over the given rows' similarities sim (m, P): :func:`standardise` in one chunk."""
    return standardise(lambda: [(0, sim)], len(sim), rows)


def select_top(sim: np.ndarray, idx: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep the K largest similarities of each row, in descending order (stable on ties)."""
    if sim.shape[1] == k:
        order = np.argsort(-sim, axis=1, kind="stable")
    else:
        part = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        order = np.take_along_axis(part, np.argsort(-np.take_along_axis(sim, part, 1), axis=1, kind="stable"), 1)
    return np.take_along_axis(sim, order, 1), np.take_along_axis(idx, order, 1)


def noisy_similarities(raw: np.ndarray, mean: float, std: float, sigma: float, secret: bytes, party: str,
                       primary_ids, scale: np.ndarray | None = None) -> np.ndarray:
    """(m, P) raw similarities standardised with (mean, std), plus each record's noise of scale
    sigma (noise.record_noise, keyed by ``primary_ids``' rows), times ``scale`` (m, P) where the
    noise is composed (:func:`composition`): a job's release and every later query of its records
    (linkage/query.py) go through this one step."""
    standardised = (raw - mean) / std
    if sigma == 0.0:
        return standardised
    if primary_ids is None:
        raise LinkageError("a noisy release (tau < 1) needs the primary identifiers: each record's noise is "
                           "keyed by them")
    noise = record_noise(secret, party, primary_ids, standardised.shape, sigma)  # (m, P)
    return standardised + (noise if scale is None else noise * scale)


def composition(idx: np.ndarray, links_per_row: np.ndarray) -> np.ndarray:
    """(m, P) the composed noise's factor sqrt(n) for candidates idx (m, P), n = the links of each
    secondary row (links_per_row (n_rows,)), at least 1 (Defences.compose)."""
    return np.sqrt(np.maximum(links_per_row[idx], 1)).astype(np.float64)


def rng_from_secret(secret: bytes) -> np.random.Generator:
    """The job's generator: 256 bits of the service's per-job secret as its entropy."""
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise LinkageError("a linkage job needs a secret of at least 16 bytes (linkage.job_secret)")
    digest = hashlib.sha256(b"fedsim-linkage-release|" + secret).digest()
    return np.random.default_rng(np.frombuffer(digest, dtype=np.uint32))


def make_tokens(n: int, rng: np.random.Generator) -> np.ndarray:
    """token_of_row: a secret random permutation, so tokens say nothing about row order."""
    return rng.permutation(n).astype(np.int64)


@dataclass(frozen=True)
class PartyPlan:
    """One secondary's release, fixed before any row is released: its statistics, noise scale,
    composed-noise counts and token permutation."""

    party: str
    k: int
    sigma: float
    mean: float
    std: float
    token_of_row: np.ndarray  # (n,) secret permutation
    links_per_row: np.ndarray | None  # (n,) links of each secondary row, when the noise is composed
    dp_sigma: float
    defences: Defences

    def rows(self, dist: np.ndarray, idx: np.ndarray, secret: bytes, primary_ids) -> tuple[np.ndarray, np.ndarray]:
        """tokens (c, K) int64 and sims (c, K) float32 of c records' candidates dist, idx (c, P)
        (``primary_ids``: those records' identifiers, keying their noise)."""
        scale = None if self.links_per_row is None else composition(idx, self.links_per_row)  # (c, P)
        noisy = noisy_similarities(similarity(dist), self.mean, self.std, self.sigma, secret, self.party,
                                   primary_ids, scale)
        sims, chosen = select_top(noisy, idx, self.k)  # (c, K) each
        return self.token_of_row[chosen], sims.astype(np.float32)

    def link(self, tokens: np.ndarray, sims: np.ndarray) -> PartyLink:
        """The primary's PartyLink holding the released rows."""
        return PartyLink(tokens, sims, self.sigma, self.mean, self.std, self.dp_sigma, self.defences.radius,
                         self.defences.compose)


def _width(chunks: Chunks) -> int:
    for _, dist, _ in chunks():
        return dist.shape[1]
    raise LinkageError("the primary party has zero rows to link")


def plan_party(party: str, chunks: Chunks, m: int, size: int, *, k: int, tau: float, rng: np.random.Generator,
               train_rows: np.ndarray | None = None, defences: Defences = Defences(), dp_eps: float = 1.0
               ) -> PartyPlan:
    """Pass over a party's candidates (``chunks`` of m records, module docstring) for its
    standardisation and composed-noise counts, then draw its tokens from ``rng``."""
    width = _width(chunks)
    if width < k:
        raise LinkageError(f"party {party!r}: {width} candidates per record, fewer than K={k}")
    rows = np.arange(m) if train_rows is None else np.asarray(train_rows)
    mean, std = standardise(lambda: ((lo, similarity(d)) for lo, d, _ in chunks()), m, rows)
    sigma = sigma_from_tau(tau, std, defences.radius)  # Theorem 2 counting a distance within the radius
    counts = None
    if defences.compose:
        if width != k:
            raise LinkageError(f"composed noise needs pool = K (the links known before the noise); got "
                               f"{width} candidates per record for K={k}")
        counts = np.zeros(size, np.int64)
        for _, _, idx in chunks():
            counts += np.bincount(idx.ravel(), minlength=size)
    return PartyPlan(party, k, sigma, mean, std, make_tokens(size, rng), counts, dp_sigma(size, mean, std, dp_eps),
                     defences)


def in_memory(dist: np.ndarray, idx: np.ndarray) -> Chunks:
    """The chunks of a search held in memory: one."""
    return lambda: iter([(0, dist, idx)])


def release(neighbours: dict[str, tuple[np.ndarray, np.ndarray]], sizes: dict[str, int], *, k: int, tau: float,
            secret: bytes, train_rows: np.ndarray | None = None, job_id: str, metric: str = "euclidean",
            dp_eps: float = 1.0, primary_ids=None, defences: Defences = Defences()) -> LinkageResult:
    """Standardise, noise and select each party's neighbours, and issue opaque tokens.

    neighbours[party] = (dist, idx), each (m, P) with P >= K candidates. Similarities are
    standardised with the mean/std of the training records' candidates, noised with sigma from
    tau (Theorem 2), and then the K largest *noisy* similarities are kept (as the reference
    does; with P == K the selection only re-orders). sizes[party] = that party's row count.
    secret: the job's secret (the service's only); every draw comes from it. The noise of a
    record is keyed by its identifiers (``primary_ids``, needed when tau < 1: noise.record_noise),
    so a later query of the record (linkage/query.py) gets the same numbers. ``defences``: the
    radius Theorem 2 speaks of and the composed noise (contracts.Defences).
    """
    if not neighbours:
        raise LinkageError("a linkage job needs at least one secondary party")
    rng = rng_from_secret(secret)
    links, secondaries = {}, {}
    for party in sorted(neighbours):  # the token draws in this order: a chunked release draws alike
        dist, idx = neighbours[party]
        plan = plan_party(party, in_memory(dist, idx), len(dist), sizes[party], k=k, tau=tau, rng=rng,
                          train_rows=train_rows, defences=defences, dp_eps=dp_eps)
        links[party] = plan.link(*plan.rows(dist, idx, secret, primary_ids))
        secondaries[party] = SecondaryLinkage(job_id, party, np.argsort(plan.token_of_row))
    return LinkageResult(PrimaryLinkage(job_id, k, tau, links, metric), secondaries)
