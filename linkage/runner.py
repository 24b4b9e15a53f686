"""A linkage job, run one way wherever it runs: the in-process linker (:func:`run_job`: the
simulation, the one-process twin, the benchmarks, linkage.pipeline.link) and the linkage service
(linkage_server/job_run.py) both run a top-K job by :func:`run_topk`. They differ only in where a
search's candidates are kept and where the release is written:

    run_job(spec, primary (m, ..), {party: (n_p, ..)}, secret=, train_rows=, job_id=) -> LinkageResult
        a job of any kind in memory: top-K (run_topk), exact (link_exact) or known (link_known)
    run_topk(spec, JobInputs(primary (m, ..), {party: (n_p, ..)}, train_rows), secret, job_id,
             searches=search_in_memory, write=release_in_memory) -> what ``write`` returns

    searches(query (m, ..), PartySearch) -> Chunks: () -> (lo, dist (c, P), idx (c, P)), ...
        in memory: one chunk; the service: its resumable chunk files, here or on Ray
    write(found {party: Chunks}, sizes {party: n_p}, query (m, ..), Release) -> the release
        in memory: a LinkageResult; the service: its files, a chunk at a time (release_files)

Every stage between (the identifiers' checks, the pool, the search's index and its recall, the
tokens drawn in the parties' name order, a chain's matching) is this module's or the stages'
it calls (linkage.pipeline, linkage.release), so a job run by the service releases what it
releases in one process, bit for bit (tests/test_release_stream.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from linkage.approx import Approx, approx_searcher, sample_rows, tie_aware_recall
from linkage.contracts import LinkageError, LinkageResult, SecondaryLinkage
from linkage.job import JobSpec, default_pool, job_id_of
from linkage.release import Chunks, Release, in_memory, release
from linkage.search import check_identifiers, search, searcher, under_floor


@dataclass(frozen=True)
class JobInputs:
    """What the parties uploaded: the primary's identifiers, each secondary's, and the primary's
    training rows (the standardisation's; None: every record)."""

    primary: object
    secondaries: dict
    train_rows: np.ndarray | None = None


@dataclass(frozen=True)
class PartySearch:
    """One secondary's search: its identifiers ``base``, the metric, the candidates kept per
    record (``k``: the job's pool) and the index (``approx``)."""

    party: str
    base: object
    metric: str
    k: int
    approx: Approx = Approx()

    def build(self):
        """q -> (dist, idx): the exact search, or the approximate index built once over ``base``."""
        if self.approx.method == "exact":
            return searcher(self.base, metric=self.metric, k=self.k, party=self.party)
        return approx_searcher(self.metric, self.base, self.k, self.approx)


Searches = Callable[[object, PartySearch], Chunks]
Write = Callable[[dict, dict, object, Release], object]


def layout(spec: JobSpec, secondaries) -> tuple[str, list[str]]:
    """The chain's anchor (checked to be a secondary when the job chains) and the secondaries
    searched top-K from the primary (a chain's anchor, else every one)."""
    secondaries = list(secondaries)
    if not secondaries:
        raise LinkageError("a linkage job needs at least one secondary party")
    anchor = spec.anchor_of(secondaries)
    if spec.chain and anchor not in secondaries:
        raise LinkageError(f"chain anchor {anchor!r} is not one of the secondaries {sorted(secondaries)}")
    return anchor, spec.searched(secondaries)


def search_in_memory(query, search: PartySearch) -> Chunks:
    """The candidates of every record, held in memory: one chunk."""
    return in_memory(*search.build()(query))


def distances(found: Chunks, rows: np.ndarray) -> np.ndarray:
    """dist (s, P) of the records ``rows`` (s,), ascending, a chunk at a time."""
    rows, out = np.asarray(rows, np.int64), None
    for lo, dist, _ in found():
        inside = (rows >= lo) & (rows < lo + len(dist))
        out = np.empty((len(rows), dist.shape[1])) if out is None else out
        out[inside] = dist[rows[inside] - lo]
    return out


def search_party(spec: JobSpec, query, base, party: str, secret: bytes, searches: Searches) -> tuple[Chunks, float]:
    """One secondary's noise-free top-pool candidates and the search's recall: 1 when exact; an
    approximate one's (linkage.approx) measured on a sample drawn from the job's ``secret`` (no
    party can predict it), refused under the floor."""
    query, base = check_identifiers(query, base, spec.k, party, spec.metric)
    pool = min(max(default_pool(spec.pool, spec.k, spec.tau, spec.defences.noisy), spec.k), len(base))
    approx = spec.approx.resolve(spec.metric, len(query), len(base), base.shape[-1] if base.ndim > 1 else 1)
    found = searches(query, PartySearch(party, base, spec.metric, pool, approx))
    if approx.method == "exact":
        return found, 1.0
    rows = sample_rows(len(query), approx, secret, party)
    recall = tie_aware_recall(spec.metric, query[rows], base, pool, distances(found, rows), np.arange(len(rows)))
    return found, under_floor(recall, approx, party, pool, len(query))


def _whole(found: Chunks) -> tuple[np.ndarray, np.ndarray]:
    """dist (m, P), idx (m, P) of every chunk, in row order (one chunk: its own arrays)."""
    parts = [(dist, idx) for _, dist, idx in found()]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([d for d, _ in parts]), np.concatenate([i for _, i in parts])


def release_in_memory(found: dict[str, Chunks], sizes: dict[str, int], query, job: Release) -> LinkageResult:
    """The whole release in memory (linkage.release.release), a chain extended to every party."""
    neighbours = {p: _whole(chunks) for p, chunks in found.items()}
    result = release(neighbours, sizes, job, primary_ids=query)
    result = with_recalls(result, job.recalls)
    if job.chain is None:
        return result
    anchor, ids = job.chain
    return chain_to(result, anchor, ids[anchor], {p: v for p, v in ids.items() if p != anchor}, job.spec.metric)


def run_topk(
    spec: JobSpec,
    inputs: JobInputs,
    secret: bytes,
    job_id: str,
    searches: Searches = search_in_memory,
    write: Write = release_in_memory,
):
    """Search every searched secondary, then release (module docstring)."""
    anchor, searched = layout(spec, inputs.secondaries)
    found, recalls = {}, {}
    for party in searched:
        found[party], recalls[party] = search_party(
            spec, inputs.primary, inputs.secondaries[party], party, secret, searches
        )
    chain = (anchor, inputs.secondaries) if spec.chain else None
    job = Release(job_id, spec, secret, inputs.train_rows, recalls, chain)
    return write(found, {p: len(inputs.secondaries[p]) for p in searched}, inputs.primary, job)


def run_job(
    spec: JobSpec,
    primary,
    secondaries: dict,
    *,
    secret: bytes,
    train_rows: np.ndarray | None = None,
    job_id: str | None = None,
    sizes: dict[str, int] | None = None,
) -> LinkageResult:
    """Link by the spec's kind and layout, in memory. job_id: None = the spec's content id. A
    "known" job takes each secondary's true row per primary record as ``secondaries``, the
    parties' row counts as ``sizes`` and its caller's ``job_id`` (``primary`` unused)."""
    if spec.kind == "known":
        if job_id is None or sizes is None:
            raise LinkageError("a known-alignment job needs its job_id and the parties' sizes")
        return link_known(secondaries, sizes, secret=secret, job_id=job_id)
    job = job_id or spec.content_id(primary, secondaries, train_rows)
    if spec.kind == "exact":
        return link_exact(primary, secondaries, secret=secret, train_rows=train_rows, metric=spec.metric, job_id=job)
    return run_topk(spec, JobInputs(primary, secondaries, train_rows), secret, job)


def with_recalls(result: LinkageResult, recalls: dict[str, float]) -> LinkageResult:
    """The result with each party's measured search recall in its PartyLink."""
    links = {q: dataclasses.replace(lk, recall=recalls.get(q, 1.0)) for q, lk in result.primary.links.items()}
    return dataclasses.replace(result, primary=dataclasses.replace(result.primary, links=links))


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
    return release(neighbours, sizes, Release(job, JobSpec(metric, 1, kind="exact"), secret, train_rows))


def link_known(true_row: dict[str, np.ndarray], sizes: dict[str, int], *, secret: bytes, job_id: str) -> LinkageResult:
    """The Combine baseline's linkage: each record's true row (known for synthetic sets only)."""
    neighbours = {p: (np.zeros((len(r), 1)), np.asarray(r, dtype=np.int64)[:, None]) for p, r in true_row.items()}
    return release(neighbours, sizes, Release(job_id, JobSpec("euclidean", 1, kind="known"), secret))
