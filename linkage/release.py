"""The release: a noise-free top-K search turned into what the parties receive, in memory or by chunks.

    similarity(dist (m, P))                    -> raw sim (m, P) = -dist
    standardise(sims, m, rows)                 -> (mean, std) over the given rows' P similarities
    plan_party(party, chunks, m, n, Release, rng) -> PartyPlan: a party's statistics, sigma and tokens
    plan_parties({party: chunks}, sizes, m, Release) -> {party: PartyPlan}, tokens drawn in name order
    PartyPlan.rows(dist (c, P), idx (c, P), secret, ids (c, ..)) -> tokens (c, K), sims (c, K) float32
    release(neighbours, sizes, Release, primary_ids) -> LinkageResult (every party's (m, P) arrays at once)

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
from dataclasses import dataclass, field
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
from linkage.job import POOL_FACTOR, JobSpec, default_pool  # noqa: F401 - re-exported: the pool, named here of old
from linkage.noise import dp_sigma, record_noise, selection_noise, sigma_from_tau

Chunks = Callable[[], Iterable[tuple[int, np.ndarray, np.ndarray]]]  # () -> (lo, dist (c, P), idx (c, P)), ...

EDGE = 3.0  # the pool's edge is smoothed over EDGE sigma of standardised similarity (edge_penalty)
BLOCK_CELLS = 1 << 17  # candidates released at a time (released_rows): 1 MB per float64 array


@dataclass(frozen=True)
class Release:
    """What a release needs to know of its job: the job itself (``spec``: K, tau, metric, the
    resolved defences), its id, and what this run of it drew and found (the job's ``secret``,
    the primary's training rows, each searched party's recall, a chain's parties)."""

    job_id: str
    spec: JobSpec
    secret: bytes
    train_rows: np.ndarray | None = None
    recalls: dict[str, float] = field(default_factory=dict)
    chain: tuple[str, dict] | None = None  # (anchor, every secondary's identifiers) for a chain layout


DP_EPS = 1.0  # the epsilon of the Laplace scale each PartyLink reports (dp_sigma), for reference


@dataclass(frozen=True)
class Draws:
    """What keys and scales one secondary's noise, in a job's release and in every query of it:
    the job's secret and the party (the keys), the standardisation of its similarities (mean,
    std) and sigma, the links of each of its rows where the noise is composed (None otherwise),
    and its row count (``size``: a pool smaller than it has an edge, :func:`edge_penalty`)."""

    secret: bytes
    party: str
    mean: float
    std: float
    sigma: float
    links_per_row: np.ndarray | None
    size: int


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
        per_row[lo : lo + len(sim)], width = np.ascontiguousarray(sim, np.float64).sum(1), sim.shape[1]
    count = len(rows) * width
    mean = float(per_row[rows].sum() / count)
    for lo, sim in sims():
        per_row[lo : lo + len(sim)] = np.square(np.ascontiguousarray(sim, np.float64) - mean).sum(1)
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


def edge_penalty(dist: np.ndarray, std: float, sigma: float) -> np.ndarray:
    """(c, P) what a candidate's selection score loses near the pool's edge: sigma (1/u - 1)^2 for
    u = (its distance's gap to the farthest candidate's) / (EDGE sigma std) < 1, 0 further in,
    +inf at the edge. The candidate that is about to leave the pool is never chosen, and one
    near it seldom, so membership in the released set changes smoothly as a query moves: there
    is no exact boundary to bisect (the P-th and (P+1)-th candidates' bisector)."""
    gap = (dist.max(axis=1, keepdims=True) - dist) / (std * EDGE * sigma)  # (c, P) >= 0
    with np.errstate(divide="ignore"):
        return sigma * np.square(np.maximum(1.0 / gap - 1.0, 0.0))


def noisy_choice(dist: np.ndarray, idx: np.ndarray, draws: Draws, k: int) -> np.ndarray:
    """(c, K) the columns of the K candidates kept of each record's pool dist, idx (c, P > K):
    the K largest standardised similarities plus selection noise of sigma (noise.selection_noise:
    a report-noisy-max), less the :func:`edge_penalty` where the pool is not the whole secondary.
    Needs no identifier: the release's plan counts the links it keeps before any row is released
    (composed noise)."""
    noise = selection_noise(draws.secret, draws.party, dist, idx, draws.sigma)
    penalty = edge_penalty(dist, draws.std, draws.sigma) if dist.shape[1] < draws.size else 0.0
    return kept_columns(dist, noise, draws.std, penalty, k)


def kept_columns(dist: np.ndarray, noise: np.ndarray, std: float, penalty, k: int) -> np.ndarray:
    """(c, K) the K columns of each pool dist (c, P) whose standardised similarity plus ``noise``
    (c, P), less ``penalty`` (:func:`edge_penalty`'s (c, P), or 0), is largest: the choice
    :func:`noisy_choice` makes with the job's noise, and an attacker simulates with its own
    (linkage.register_attacks)."""
    score = -dist / std + noise  # the similarity's order, plus noise
    if not np.isscalar(penalty):
        score = score - penalty
    return np.argpartition(-score, k - 1, axis=1)[:, :k]


def released_rows(
    dist: np.ndarray, idx: np.ndarray, draws: Draws, k: int, primary_ids
) -> tuple[np.ndarray, np.ndarray]:
    """sims (c, K) float64 descending and rows (c, K) of c records' pools dist, idx (c, P): the
    one step a job's release (PartyPlan.rows) and every query (linkage/query.py) take, a block of
    BLOCK_CELLS at a time (row by row alike, so the working memory is bounded whatever P).

    Noisy similarities (:func:`noisy_similarities`, composed by ``draws.links_per_row`` if
    given); under noise with P > K the K kept are :func:`noisy_choice`'s, else the K largest
    (P = K or no noise: the release of old, bit for bit); released in the order of their noisy
    similarity. ``primary_ids``: the c records' identifiers, which key their noise."""
    step = max(1, BLOCK_CELLS // max(dist.shape[1], 1))
    if len(dist) <= step:
        return _released_block(dist, idx, draws, k, primary_ids)
    ids = None if primary_ids is None else np.asarray(primary_ids)
    parts = [
        _released_block(
            dist[lo : lo + step], idx[lo : lo + step], draws, k, None if ids is None else ids[lo : lo + step]
        )
        for lo in range(0, len(dist), step)
    ]
    return np.concatenate([s for s, _ in parts]), np.concatenate([i for _, i in parts])


def _released_block(
    dist: np.ndarray, idx: np.ndarray, draws: Draws, k: int, primary_ids
) -> tuple[np.ndarray, np.ndarray]:
    scale = None if draws.links_per_row is None else composition(idx, draws.links_per_row)  # (c, P)
    noisy = noisy_similarities(similarity(dist), draws, primary_ids, scale)
    if draws.sigma > 0 and dist.shape[1] > k:
        cols = noisy_choice(dist, idx, draws, k)
        noisy, idx = np.take_along_axis(noisy, cols, 1), np.take_along_axis(idx, cols, 1)
    return select_top(noisy, idx, k)


def noisy_similarities(raw: np.ndarray, draws: Draws, primary_ids, scale: np.ndarray | None = None) -> np.ndarray:
    """(m, P) raw similarities standardised with (draws.mean, draws.std), plus each record's
    noise of scale draws.sigma (noise.record_noise, keyed by ``primary_ids``' rows), times
    ``scale`` (m, P) where the noise is composed (:func:`composition`): a job's release and every
    later query of its records (linkage/query.py) go through this one step."""
    standardised = (raw - draws.mean) / draws.std
    if draws.sigma == 0.0:
        return standardised
    if primary_ids is None:
        raise LinkageError(
            "a noisy release (tau < 1) needs the primary identifiers: each record's noise is keyed by them"
        )
    noise = record_noise(draws.secret, draws.party, primary_ids, standardised.shape, draws.sigma)  # (m, P)
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
    composed-noise counts and token permutation. Counts over a noisy choice (pool > K) are taken
    at the first row released, which brings the secret (:meth:`links`), from ``chunks``."""

    party: str
    k: int
    sigma: float
    mean: float
    std: float
    token_of_row: np.ndarray  # (n,) secret permutation
    links_per_row: np.ndarray | None  # (n,) links of each secondary row, when the noise is composed
    dp_sigma: float
    defences: Defences
    chunks: Chunks | None = None  # the candidates, when the composed noise counts a noisy choice
    counted: dict = field(default_factory=dict, compare=False, repr=False)  # secret -> those counts

    def draws(self, secret: bytes, links_per_row: np.ndarray | None = None) -> Draws:
        """The party's noise under the job's ``secret`` (composed by ``links_per_row`` if given)."""
        return Draws(secret, self.party, self.mean, self.std, self.sigma, links_per_row, len(self.token_of_row))

    def links(self, secret: bytes) -> np.ndarray | None:
        """(n,) the links each secondary row is released in, when the noise is composed."""
        if self.chunks is None:
            return self.links_per_row
        if secret not in self.counted:
            counts = np.zeros(len(self.token_of_row), np.int64)
            for _, dist, idx in self.chunks():
                cols = noisy_choice(dist, idx, self.draws(secret), self.k)
                counts += np.bincount(np.take_along_axis(idx, cols, 1).ravel(), minlength=len(counts))
            self.counted[secret] = counts
        return self.counted[secret]

    def rows(self, dist: np.ndarray, idx: np.ndarray, secret: bytes, primary_ids) -> tuple[np.ndarray, np.ndarray]:
        """tokens (c, K) int64 and sims (c, K) float32 of c records' candidates dist, idx (c, P)
        (``primary_ids``: those records' identifiers, keying their noise)."""
        draws = self.draws(secret, self.links(secret))
        sims, chosen = released_rows(dist, idx, draws, self.k, primary_ids)  # (c, K) each
        return self.token_of_row[chosen], sims.astype(np.float32)

    def link(self, tokens: np.ndarray, sims: np.ndarray) -> PartyLink:
        """The primary's PartyLink holding the released rows."""
        return PartyLink(
            tokens,
            sims,
            self.sigma,
            self.mean,
            self.std,
            self.dp_sigma,
            self.defences.radius_of(self.party),
            self.defences.compose,
        )


def _width(chunks: Chunks) -> int:
    for _, dist, _ in chunks():
        return dist.shape[1]
    raise LinkageError("the primary party has zero rows to link")


def plan_party(party: str, chunks: Chunks, m: int, size: int, job: Release, rng: np.random.Generator) -> PartyPlan:
    """Pass over a party's candidates (``chunks`` of m records, module docstring; ``size``: its
    rows) for its standardisation and composed-noise counts, then draw its tokens from ``rng``."""
    k, tau, defences = job.spec.k, job.spec.tau, job.spec.defences
    width = _width(chunks)
    if width < k:
        raise LinkageError(f"party {party!r}: {width} candidates per record, fewer than K={k}")
    rows = np.arange(m) if job.train_rows is None else np.asarray(job.train_rows)
    # over each record's K nearest (the pool's first K columns, ascending), whatever the pool: the
    # statistics, and so sigma and the noise on a distance, are those of the K neighbours released
    mean, std = standardise(lambda: ((lo, similarity(d[:, :k])) for lo, d, _ in chunks()), m, rows)
    # Theorem 2 counting a distance within the party's radius, raised to its floor's noise on a distance
    sigma = max(sigma_from_tau(tau, std, defences.radius_of(party)), defences.noise_of(party) / std)
    counts, chosen_later = None, defences.compose and width > k and sigma > 0
    if defences.compose and not chosen_later:  # pool = K (or no noise): the links are the candidates
        counts = np.zeros(size, np.int64)
        for _, _, idx in chunks():
            counts += np.bincount(idx[:, :k].ravel(), minlength=size)
    return PartyPlan(
        party,
        k,
        sigma,
        mean,
        std,
        make_tokens(size, rng),
        counts,
        dp_sigma(size, mean, std, DP_EPS),
        defences,
        chunks if chosen_later else None,
    )


def plan_parties(found: dict[str, Chunks], sizes: dict[str, int], m: int, job: Release) -> dict[str, PartyPlan]:
    """Every searched party's plan, in name order, their tokens drawn one after another from the
    job's secret: the one order the in-memory and the chunked release (linkage_server.release_files)
    share, so that both release the same tokens."""
    rng = rng_from_secret(job.secret)
    return {party: plan_party(party, found[party], m, sizes[party], job, rng) for party in sorted(found)}


def in_memory(dist: np.ndarray, idx: np.ndarray) -> Chunks:
    """The chunks of a search held in memory: one."""
    return lambda: iter([(0, dist, idx)])


def release(
    neighbours: dict[str, tuple[np.ndarray, np.ndarray]], sizes: dict[str, int], job: Release, primary_ids=None
) -> LinkageResult:
    """Standardise, noise and select each party's neighbours, and issue opaque tokens.

    neighbours[party] = (dist, idx), each (m, P) with P >= K candidates. Similarities are
    standardised with the mean/std of the training records' candidates, noised with sigma from
    tau (Theorem 2); with P > K under noise the K kept are chosen under noise
    (:func:`noisy_choice`), and the K are released in the order of their noisy similarities
    (with P == K that only re-orders). sizes[party] = that party's row count.
    job.secret: the job's secret (the service's only); every draw comes from it. The noise of a
    record is keyed by its identifiers (``primary_ids``, needed when tau < 1: noise.record_noise),
    so a later query of the record (linkage/query.py) gets the same numbers. job.spec.defences:
    the radius Theorem 2 speaks of and the composed noise (contracts.Defences).
    """
    if not neighbours:
        raise LinkageError("a linkage job needs at least one secondary party")
    m = len(next(iter(neighbours.values()))[0])
    plans = plan_parties({p: in_memory(*nb) for p, nb in neighbours.items()}, sizes, m, job)
    links, secondaries = {}, {}
    for party, plan in plans.items():
        links[party] = plan.link(*plan.rows(*neighbours[party], job.secret, primary_ids))
        secondaries[party] = SecondaryLinkage(job.job_id, party, np.argsort(plan.token_of_row))
    primary = PrimaryLinkage(job.job_id, job.spec.k, job.spec.tau, links, job.spec.metric)
    return LinkageResult(primary, secondaries)
