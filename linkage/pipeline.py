"""The linkage pipeline: validate -> top-K -> similarity -> standardise -> noise -> select -> tokens.

Array contracts (m primary records, n secondary records, d identifier dims, K neighbours):
  topk_*(query, base, k)                     -> dist (m, K) float64 ascending, idx (m, K) int64
      euclidean: query (m, d) float, base (n, d) float
      strings:   query (m,) or (m, c) str, base (n,) or (n, c) str: STRING_METRICS, edit (raw
                 Levenshtein) and normalised distances in [0, 1] (linkage.scorers; c columns)
      hamming:   query (m, B) uint8, base (n, B) uint8     (packed bits; linkage.hamming)
  similarity(dist (m, K))                    -> raw sim (m, K) = -dist
  fit_standardizer(sim (m, K), rows)         -> (mean, std) over the given rows' K similarities
  record_noise(secret, party, ids (m, ..), (m, P), sigma) -> N(0, sigma) (m, P), row i keyed by record i
  select_top(sim (m, P), idx (m, P), k)      -> the K largest (noisy) similarities per row, descending
  noisy_choice(dist, idx (m, P), draws, k)   -> under noise, which K of a pool of P > K are kept (release.py)
  make_tokens(n, rng)                        -> token_of_row (n,) a random permutation
:func:`search` is the expensive, noise-free stage (cacheable, resumable in chunks);
:func:`release` (linkage/release.py: the stages after the search, in memory or by chunks) turns
its output into what the parties receive. :func:`link` = both.
Every random draw of a job comes from its secret, which only the linkage service holds
(:mod:`linkage.job_secret`); no party chooses, reads or can derive it. Token permutations come
from :func:`rng_from_secret`, a generator keyed by it; the noise of each record from
:func:`linkage.noise.record_noise`, keyed by it and the record's identifiers, so that a later
query of the record (linkage/query.py) gets the same noise.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Callable

import numpy as np
from scipy.spatial import cKDTree

from linkage.approx import Approx, approx_topk, sample_rows, tie_aware_recall
from linkage.contracts import (
    Defences,
    LinkageError,
    LinkageResult,
    SecondaryLinkage,
    identifier_bytes,
)
from linkage.exact import (  # noqa: F401 - re-exported: the exact searches, in one place
    BLOCK_BYTES,
    Progress,
    _tree_topk,
    topk,
    topk_bruteforce,
    topk_euclidean,
    topk_kdtree,
)
from linkage.metrics import metric as metric_named
from linkage.noise import dp_sigma, record_noise, sigma_from_tau  # noqa: F401 - re-exported
from linkage.release import (  # noqa: F401 - re-exported: the pipeline's stages, in one place
    composition,
    default_pool,
    fit_standardizer,
    make_tokens,
    release,
    rng_from_secret,
    select_top,
    similarity,
)

# ----------------------------------------------------------------------------- validation


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


# ----------------------------------------------------------------------------- top-K


# ----------------------------------------------------------------------------- the job


def job_id_of(
    primary_ids,
    secondary_ids: dict,
    k: int,
    tau: float,
    metric: str = "euclidean",
    pool: int = 0,
    train_rows: np.ndarray | None = None,
    defences: Defences = Defences(),
    approx: Approx = Approx(),
) -> str:
    """A content hash of the job: the same inputs and parameters give the same id."""
    h = hashlib.sha256()
    for arr in map(np.asarray, (primary_ids, *(secondary_ids[p] for p in sorted(secondary_ids)))):
        h.update(f"|{arr.shape}|".encode())  # each party's shape: no two splits of the rows collide
        h.update(identifier_bytes(arr))
    if train_rows is not None:
        h.update(b"|train|" + np.asarray(train_rows, np.int64).tobytes())
    tail = (
        f"|{pool}" if pool and pool != default_pool(0, k, tau, defences.noisy) else ""
    )  # the default pool, named or not: one job
    h.update(f"{sorted(secondary_ids)}|{k}|{tau!r}|{metric}{tail}{defences.tag()}{approx.tag()}".encode())
    return h.hexdigest()[:16]


def chain_tag(metric: str, anchor: str) -> str:
    """A chain job's metric in its content id: one name for the service and the in-process linker."""
    return f"{metric}-chain-{anchor}"


def searcher(base, *, metric: str, k: int, party: str) -> Callable[[object], tuple[np.ndarray, np.ndarray]]:
    """query -> :func:`search` (query, base): for many chunks of queries against one base, which is
    validated, and its k-d tree (Euclidean at d <= 8) built, once rather than per chunk."""
    base = _as_identifiers(base, metric, party)
    tree = cKDTree(base) if metric_named(metric).kind == "numbers" and base.shape[1] <= 8 else None

    def find(query) -> tuple[np.ndarray, np.ndarray]:
        query, _ = _pair(_as_identifiers(query, metric, "primary"), base, k, party, metric)
        return topk(metric, query, base, k) if tree is None else _tree_topk(tree, query, k)

    return find


def search(
    query, base, *, metric: str, k: int, party: str, progress: Progress | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Validate one (primary, secondary) pair and find each primary record's K nearest: (dist, idx)."""
    query, base = check_identifiers(query, base, k, party, metric)
    return topk(metric, query, base, k, progress)


def link(
    primary_ids,
    secondary_ids: dict,
    *,
    k: int,
    tau: float,
    secret: bytes,
    train_rows: np.ndarray | None = None,
    metric: str = "euclidean",
    pool: int = 0,
    job_id: str | None = None,
    defences: Defences = Defences(),
    approx: Approx = Approx(),
) -> LinkageResult:
    """Link every primary record to its K most similar records of each secondary party.

    pool > K takes the top-`pool` candidates first and keeps K of them chosen under noise
    (release.noisy_choice); pool = 0: release.default_pool (K at tau = 1, 4 K under noise). ``approx``:
    an approximate search (linkage.approx), its tie-aware recall measured on a sample and
    released in each PartyLink; a recall under ``approx.recall_floor`` fails the job, naming it.
    """
    if not secondary_ids:
        raise LinkageError("a linkage job needs at least one secondary party")
    neighbours, sizes, recalls = {}, {}, {}
    for party, base in secondary_ids.items():
        query, base = check_identifiers(primary_ids, base, k, party, metric)
        p = min(max(default_pool(pool, k, tau, defences.noisy), k), len(base))
        neighbours[party], recalls[party] = approximate_search(query, base, metric, p, party, approx, secret)
        sizes[party] = len(base)
    job = job_id or job_id_of(primary_ids, secondary_ids, k, tau, metric, pool, train_rows, defences, approx)
    result = release(
        neighbours,
        sizes,
        k=k,
        tau=tau,
        secret=secret,
        train_rows=train_rows,
        job_id=job,
        metric=metric,
        primary_ids=primary_ids,
        defences=defences,
    )
    return with_recalls(result, recalls)


def with_recalls(result: LinkageResult, recalls: dict[str, float]) -> LinkageResult:
    """The result with each party's measured search recall in its PartyLink."""
    links = {q: dataclasses.replace(lk, recall=recalls.get(q, 1.0)) for q, lk in result.primary.links.items()}
    return dataclasses.replace(result, primary=dataclasses.replace(result.primary, links=links))


def approximate_search(
    query, base, metric: str, k: int, party: str, approx: Approx, secret: bytes
) -> tuple[tuple[np.ndarray, np.ndarray], float]:
    """(dist, idx) (m, k) by the job's search, and its tie-aware recall (1.0 when exact) on a
    sample drawn from the job's ``secret``, refused under the floor."""
    approx = approx.resolve(metric, len(query), len(base), np.asarray(base).shape[-1] if np.ndim(base) > 1 else 1)
    if approx.method == "exact":
        return topk(metric, query, base, k), 1.0
    dist, idx = approx_topk(metric, query, base, k, approx)
    recall = tie_aware_recall(metric, query, base, k, dist, sample_rows(len(query), approx, secret, party))
    return (dist, idx), under_floor(recall, approx, party, k, len(query))


def under_floor(recall: float, approx: Approx, party: str, k: int, m: int) -> float:
    """The recall measured on a sample of m records, refused by name under the job's floor."""
    if recall < approx.recall_floor:
        raise LinkageError(
            f"party {party!r}: the {approx.method} search found {recall:.4f} of the true top-{k} "
            f"(tie-aware, on {min(m, approx.sample)} records), under the recall floor "
            f"{approx.recall_floor}; widen the search (width: ef_search / nprobe / candidates) or search exactly"
        )
    return recall


def link_chain(
    primary_ids,
    secondary_ids: dict,
    *,
    anchor: str,
    k: int,
    tau: float,
    secret: bytes,
    train_rows: np.ndarray | None = None,
    metric: str = "euclidean",
    pool: int = 0,
    job_id: str | None = None,
    defences: Defences = Defences(),
) -> LinkageResult:
    """Paper App. C: link every other secondary one-to-one to the ``anchor`` secondary (each
    anchor row to its most similar row of that party), then the primary top-K to the anchor.

    All parties share the anchor's tokens and similarities; each party's token -> row map
    points at the row chained to that anchor row. Parties must have the same identifier kind."""
    if anchor not in secondary_ids:
        raise LinkageError(f"chain anchor {anchor!r} is not one of the secondaries {sorted(secondary_ids)}")
    base = secondary_ids[anchor]
    check_identifiers(primary_ids, base, k, anchor, metric)
    p = min(max(default_pool(pool, k, tau, defences.noisy), k), len(base))
    neighbours = {anchor: search(primary_ids, base, metric=metric, k=p, party=anchor)}
    job = job_id or job_id_of(primary_ids, secondary_ids, k, tau, chain_tag(metric, anchor), pool, train_rows, defences)
    result = release(
        neighbours,
        {anchor: len(base)},
        k=k,
        tau=tau,
        secret=secret,
        train_rows=train_rows,
        job_id=job,
        metric=metric,
        primary_ids=primary_ids,
        defences=defences,
    )
    return chain_to(result, anchor, base, {p: ids for p, ids in secondary_ids.items() if p != anchor}, metric)


def chain_to(anchored: LinkageResult, anchor: str, anchor_ids, others: dict, metric: str) -> LinkageResult:
    """Extend a released primary -> anchor linkage to the other secondaries: each anchor row is
    linked one-to-one to its most similar row of every other party, which shares its tokens."""
    link_a, rows_a = anchored.primary.links[anchor], anchored.secondaries[anchor].row_of_token
    links, secondaries = {anchor: link_a}, {anchor: anchored.secondaries[anchor]}
    for party, ids in others.items():
        check_identifiers(anchor_ids, ids, 1, party, metric)
        _, match = search(anchor_ids, ids, metric=metric, k=1, party=party)  # (n_anchor, 1) one-to-one
        links[party] = link_a
        secondaries[party] = SecondaryLinkage(anchored.primary.job_id, party, match[:, 0][rows_a])
    return LinkageResult(dataclasses.replace(anchored.primary, links=links, layout="chain"), secondaries)


def link_exact(
    primary_ids,
    secondary_ids: dict,
    *,
    secret: bytes,
    train_rows: np.ndarray | None = None,
    metric: str = "euclidean",
    job_id: str | None = None,
) -> LinkageResult:
    """The Exact baseline's linkage: each record's neighbour at distance 0, if any.

    A record without an exact match is linked to a virtual row n of the secondary (its token
    is the n+1-th); the secondary maps it to its mean features (mean imputation).
    """
    neighbours, sizes = {}, {}
    for party, base in secondary_ids.items():
        dist, idx = search(primary_ids, base, metric=metric, k=1, party=party)
        idx = np.where(dist > 0, len(base), idx)  # (m, 1)
        neighbours[party], sizes[party] = (dist, idx), len(base) + 1
    job = job_id or job_id_of(primary_ids, secondary_ids, 1, 1.0, f"{metric}-exact", 0, train_rows)
    return release(neighbours, sizes, k=1, tau=1.0, secret=secret, train_rows=train_rows, job_id=job, metric=metric)


def link_known(true_row: dict[str, np.ndarray], sizes: dict[str, int], *, secret: bytes, job_id: str) -> LinkageResult:
    """The Combine baseline's linkage: each record's true row (known for synthetic sets only)."""
    neighbours = {p: (np.zeros((len(r), 1)), np.asarray(r, dtype=np.int64)[:, None]) for p, r in true_row.items()}
    return release(neighbours, sizes, k=1, tau=1.0, secret=secret, job_id=job_id)
