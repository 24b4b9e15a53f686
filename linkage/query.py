"""Linkage for new primary records against a finished job (predict): the same regime as the
job's release, so a predicted record tells the primary no more than a training record did.

    query(new_ids (q, d) | (q,), QueryJob(base[party] (n, d) | (n,), trained: PrimaryLinkage,
          row_of_token[party] (n,), pool=P), secret=...) -> PrimaryLinkage of the q new records

Per secondary: the top-P candidates by the job's metric (P: the job's pool, by default
linkage.release.default_pool), similarities standardised with the job's *training* statistics
(never refitted on the query), Gaussian noise of the job's sigma, the K kept chosen under noise
when P > K (linkage.release.noisy_choice), and rows turned into the job's own tokens (the inverse
of the secondary's token -> row map), so each secondary resolves them with the map it already holds.

The noise of a record is a function of the job's secret and the record's identifiers
(linkage.noise.record_noise), the very noise the job's release gave it: asking for a training
record, or the same new record again, alone or in any batch, returns the same noisy
similarities and the same choice of K, so repeated queries of one record (``-0.0`` for ``0.0``
too) cannot be averaged. (Queries of slightly moved copies get other noise, which the query
budget bounds: docs/threat-model.md, bench/query_bisection.py.) With the training records as the query the
result equals the job's release bitwise, noise included (tests/test_query.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from linkage.contracts import LinkageError, PartyLink, PrimaryLinkage
from linkage.release import Draws, default_pool, released_rows
from linkage.search import search


def tokens_of_rows(row_of_token: np.ndarray, party: str, n_rows: int) -> np.ndarray:
    """token_of_row (n,): the inverse of a secondary's token -> row map, which must be a
    permutation of that party's n rows (the job's own)."""
    row_of_token = np.asarray(row_of_token, dtype=np.int64)
    if len(row_of_token) != n_rows or not np.array_equal(np.sort(row_of_token), np.arange(n_rows)):
        raise LinkageError(
            f"party {party!r}: its token map covers {len(row_of_token)} rows, not a permutation "
            f"of its {n_rows} identifiers; the map and the identifiers are from different jobs"
        )
    return np.argsort(row_of_token)


def links_of_rows(tokens: np.ndarray, row_of_token: np.ndarray, n_rows: int) -> np.ndarray:
    """(n,) how many of the release's links (tokens, any shape) go to each secondary row."""
    rows = np.asarray(row_of_token, np.int64)[np.asarray(tokens).ravel()]
    return np.bincount(rows, minlength=n_rows)


@dataclass(frozen=True)
class QueryJob:
    """The finished job a query is answered from: each secondary's identifiers (``base``), the
    release for the job's own records (``trained``), each secondary's token -> row map, the job's
    candidate pool, a composed job's links per secondary row (``links_per_row[party]`` (n,),
    counted once: :func:`links_per_row`; None: counted from ``trained``'s tokens) and a chain
    job's anchor as the job named it ("" = the first by name, linkage.job.JobSpec.anchor_of)."""

    base: dict
    trained: PrimaryLinkage
    row_of_token: dict
    pool: int = 0
    links_per_row: dict | None = None
    anchor: str = ""


def query(new_ids, job: QueryJob, *, secret: bytes) -> PrimaryLinkage:
    """Tokens and noisy similarities of the new records' K neighbours in each secondary, as
    ``job`` released them for its own records."""
    trained = job.trained
    _check_query(trained, job.base, job.row_of_token)
    # a chain's parties share its anchor's tokens (linkage.runner.chain_to): only the anchor is
    # searched, every party gets its link
    searched = [job.anchor or min(trained.links)] if trained.layout == "chain" else sorted(trained.links)
    found = {party: _query_party(new_ids, job, party, secret) for party in searched}
    order = searched + [p for p in trained.links if p not in searched]  # the release's: a chain's anchor first
    links = {party: found.get(party, found[searched[0]]) for party in order}
    return PrimaryLinkage(trained.job_id, trained.k, trained.tau, links, trained.metric, trained.layout)


def _check_query(trained: PrimaryLinkage, base: dict, row_of_token: dict) -> None:
    """A query can be answered: the job links independently or as a chain whose parties share its
    anchor's tokens, and it names exactly the job's parties."""
    if trained.layout not in ("independent", "chain"):
        raise LinkageError(f"linkage job {trained.job_id} is a {trained.layout!r} job; it cannot be queried")
    shared = trained.links[min(trained.links)].tokens if trained.layout == "chain" else None
    if shared is not None and any(not np.array_equal(x.tokens, shared) for x in trained.links.values()):
        raise LinkageError(f"linkage job {trained.job_id}: a chain whose parties do not share the anchor's tokens")
    if set(base) != set(trained.links) or set(row_of_token) != set(trained.links):
        raise LinkageError(
            f"the query names parties {sorted(base)} with maps {sorted(row_of_token)}, but job "
            f"{trained.job_id} linked {sorted(trained.links)}"
        )


def _query_party(new_ids, job: QueryJob, party: str, secret: bytes) -> PartyLink:
    """One secondary's link of the new records, released as the job released its own."""
    trained, base_ids, row_of_token = job.trained, job.base[party], job.row_of_token[party]
    link = trained.links[party]
    n = len(np.asarray(base_ids))
    token_of_row = tokens_of_rows(row_of_token, party, n)
    noisy = any(lk.sigma > 0 for lk in trained.links.values())  # a floor's noise, whatever tau
    pool = default_pool(job.pool, trained.k, trained.tau, noisy)
    p = min(max(trained.k, pool), n)  # the job's pool, as link() clips it
    dist, idx = search(new_ids, base_ids, metric=trained.metric, k=p, party=party)
    counts = None
    if link.composed:  # the job's links per row: its release's tokens mapped back to rows
        counts = (
            job.links_per_row[party] if job.links_per_row is not None else links_of_rows(link.tokens, row_of_token, n)
        )
    draws = Draws(secret, party, link.sim_mean, link.sim_std, link.sigma, counts, n)  # the job's statistics and sigma
    sims, chosen = released_rows(dist, idx, draws, trained.k, new_ids)  # (q, K) descending
    return PartyLink(
        token_of_row[chosen],
        sims.astype(np.float32),
        link.sigma,
        link.sim_mean,
        link.sim_std,
        link.dp_sigma,
        link.radius,
        link.composed,
    )
