"""The linkage pipeline: validate -> top-K -> similarity -> standardise -> noise -> select -> tokens.

Array contracts (m primary records, n secondary records, d identifier dims, K neighbours):
  topk_*(query, base, k)                     -> dist (m, K) float64 ascending, idx (m, K) int64
      numbers:   query (m, d) float, base (n, d) float (euclidean, manhattan, chebyshev: Metric.p)
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

import numpy as np

from linkage.approx import Approx
from linkage.contracts import Defences, LinkageResult
from linkage.exact import (  # noqa: F401 - re-exported: the exact searches, in one place
    BLOCK_BYTES,
    Progress,
    topk,
    topk_bruteforce,
    topk_euclidean,
    topk_kdtree,
)
from linkage.job import JobSpec, chain_tag, default_pool, job_id_of  # noqa: F401 - re-exported
from linkage.noise import dp_sigma, record_noise, sigma_from_tau  # noqa: F401 - re-exported
from linkage.release import (  # noqa: F401 - re-exported: the pipeline's stages, in one place
    Release,
    composition,
    fit_standardizer,
    make_tokens,
    release,
    rng_from_secret,
    select_top,
    similarity,
)
from linkage.runner import chain_to, link_exact, link_known, run_job, with_recalls  # noqa: F401 - re-exported
from linkage.search import check_identifiers, search, searcher, under_floor  # noqa: F401 - re-exported


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
    """Link every primary record to its K most similar records of each secondary party: the job
    ``JobSpec(metric, k, tau, pool=, defences=, approx=)`` run by linkage.runner.run_topk.

    pool > K takes the top-`pool` candidates first and keeps K of them chosen under noise
    (release.noisy_choice); pool = 0: release.default_pool (K at tau = 1, 4 K under noise). ``approx``:
    an approximate search (linkage.approx), its tie-aware recall measured on a sample and
    released in each PartyLink; a recall under ``approx.recall_floor`` fails the job, naming it.
    """
    spec = JobSpec(metric, k, tau, pool=pool, defences=defences, approx=approx)
    return run_job(spec, primary_ids, secondary_ids, secret=secret, train_rows=train_rows, job_id=job_id)


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
    anchor row to its most similar row of that party), then the primary top-K to the anchor:
    the job ``JobSpec(..., layout="chain", anchor=anchor)`` run by linkage.runner.run_topk.

    All parties share the anchor's tokens and similarities; each party's token -> row map
    points at the row chained to that anchor row. Parties must have the same identifier kind."""
    spec = JobSpec(metric, k, tau, layout="chain", anchor=anchor, pool=pool, defences=defences)
    return run_job(spec, primary_ids, secondary_ids, secret=secret, train_rows=train_rows, job_id=job_id)
