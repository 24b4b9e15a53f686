"""A job's release written to disk chunk by chunk: the service's memory is bounded by a chunk,
whatever the number of primary records.

    write_release(results, scratch, searched {party: ChunkFiles}, sizes, query, job) -> (skeleton, privacy)

For each secondary (in name order, as linkage.release.release draws its tokens) the plan
(statistics, sigma, tokens) is made in passes over the finished search chunks, then every chunk
is released and appended to two .npy files under ``scratch`` (tokens (m, K) int64, sims (m, K)
float32). ``results/primary.npz`` is assembled from them member by member (linkage.store.write_npz),
the secondaries' files are small (n rows). The bytes of every array equal the in-memory release's
(linkage.release), so a job gives what ``link`` gives in one process (tests/test_release_stream.py).

The privacy report (linkage.privacy) is measured on the records linked to the attacked tokens
only, with the links per token counted over the whole release: the same report as on the whole.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from files.atomic import write_atomic
from linkage.binding import bind_result
from linkage.contracts import LinkageResult, PrimaryLinkage, SecondaryLinkage
from linkage.job import JobSpec
from linkage.pipeline import chain_to
from linkage.privacy import MAX_TOKENS, attacked_tokens, failure_report
from linkage.privacy import privacy_report as report
from linkage.release import PartyPlan, plan_party, rng_from_secret
from linkage.store import NpyWriter, npy_chunks, primary_meta, secondary_bytes, write_npz
from linkage_server.chunk_search import ChunkFiles


@dataclass(frozen=True)
class Job:
    """What a release needs to know of its job: the job itself (``spec``: K, tau, metric, the
    resolved defences) and what this run of it drew and found."""

    job_id: str
    spec: JobSpec
    secret: bytes
    train_rows: np.ndarray | None
    recalls: dict[str, float]
    chain: tuple[str, dict] | None = None  # (anchor, every secondary's identifiers) for a chain layout
    step: int = 20_000  # rows read at a time from the released files


def _release_party(plan: PartyPlan, files: ChunkFiles, query, secret: bytes, scratch: Path) -> tuple[Path, Path]:
    """The party's released rows, appended chunk by chunk: (tokens .npy (m, K), sims .npy (m, K))."""
    paths = scratch / f"tokens-{plan.party}.npy", scratch / f"sims-{plan.party}.npy"
    shape = (len(query), plan.k)
    with NpyWriter(paths[0], shape, np.int64) as tokens_out, NpyWriter(paths[1], shape, np.float32) as sims_out:
        for lo, dist, idx in files():
            tokens, sims = plan.rows(dist, idx, secret, query[lo : lo + len(dist)])  # (c, K) each
            tokens_out.write(tokens)
            sims_out.write(sims)
    return paths


def _skeleton(plans: dict[str, PartyPlan], job: Job, query) -> LinkageResult:
    """The release without its (m, K) rows: every figure, token map and the chain's matching."""
    empty = np.empty((0, job.spec.k))
    links = {
        p: dataclasses.replace(
            plan.link(empty.astype(np.int64), empty.astype(np.float32)), recall=job.recalls.get(p, 1.0)
        )
        for p, plan in plans.items()
    }
    secondaries = {p: SecondaryLinkage(job.job_id, p, np.argsort(plan.token_of_row)) for p, plan in plans.items()}
    result = LinkageResult(PrimaryLinkage(job.job_id, job.spec.k, job.spec.tau, links, job.spec.metric), secondaries)
    if job.chain:
        anchor, ids = job.chain
        result = chain_to(result, anchor, ids[anchor], {p: v for p, v in ids.items() if p != anchor}, job.spec.metric)
    return bind_result(result, query)  # primary.npz names the identifiers it linked


def write_release(
    results: Path, scratch: Path, searched: dict[str, ChunkFiles], sizes: dict[str, int], query, job: Job
) -> tuple[LinkageResult, dict[str, tuple[Path, Path]]]:
    """Release every searched party into ``results`` (module docstring); returns the skeleton and,
    per party of the release, its (tokens, sims) files under ``scratch`` (removed by the caller)."""
    rng, plans, files = rng_from_secret(job.secret), {}, {}
    for party in sorted(searched):
        plans[party] = plan_party(
            party,
            searched[party],
            len(query),
            sizes[party],
            k=job.spec.k,
            tau=job.spec.tau,
            rng=rng,
            train_rows=job.train_rows,
            defences=job.spec.defences,
        )
        files[party] = _release_party(plans[party], searched[party], query, job.secret, scratch)
    skeleton = _skeleton(plans, job, query)
    source = {p: files[job.chain[0] if job.chain else p] for p in skeleton.primary.links}  # a chain shares its anchor's
    members = {"meta": primary_meta(skeleton.primary)}
    for p, (tokens, sims) in source.items():
        members[f"tokens__{p}"], members[f"sims__{p}"] = tokens, sims
    write_npz(results / "primary.npz", members)
    for party, s in skeleton.secondaries.items():
        write_atomic(results / f"secondary-{party}.npz", secondary_bytes(s))
    return skeleton, source


def _rows_of(path: Path, rows: np.ndarray, step: int) -> np.ndarray:
    """The given rows (ascending) of a .npy file, read a chunk at a time."""
    parts = [arr[rows[(rows >= lo) & (rows < lo + len(arr))] - lo] for lo, arr in npy_chunks(path, step)]
    return np.concatenate(parts)


def privacy_report(
    skeleton: LinkageResult, files: dict[str, tuple[Path, Path]], query, ids: dict, job: Job, parties: list[str] | None
) -> dict:
    """The job's privacy report (linkage.privacy) from the released files (module docstring)."""
    own = parties or sorted(skeleton.primary.links)
    counts, keep = {}, np.zeros(len(query), bool)
    for p in own:
        row_of_token = skeleton.secondaries[p].row_of_token
        counts[p] = np.zeros(len(row_of_token), np.int64)
        for _, tokens in npy_chunks(files[p][0], job.step):
            counts[p] += np.bincount(tokens.ravel(), minlength=len(row_of_token))
        only = attacked_tokens(counts[p], p, row_of_token, len(ids[p]), MAX_TOKENS, job.secret)
        for lo, tokens in npy_chunks(files[p][0], job.step):
            keep[lo : lo + len(tokens)] |= np.isin(tokens, only).any(axis=1)
    rows = np.flatnonzero(keep)  # the records linked to an attacked token: every link the attacks read
    links = {
        p: dataclasses.replace(
            lk, tokens=_rows_of(files[p][0], rows, job.step), sims=_rows_of(files[p][1], rows, job.step)
        )
        if p in own
        else lk
        for p, lk in skeleton.primary.links.items()
    }
    restricted = dataclasses.replace(skeleton, primary=dataclasses.replace(skeleton.primary, links=links))
    return report(restricted, query[rows], ids, job.spec.metric, parties=parties, counts=counts, secret=job.secret)


def safe_privacy_report(skeleton: LinkageResult, files, query, ids: dict, job: Job, parties) -> dict:
    """:func:`privacy_report`, or, when it fails, a report that says so (the release stands)."""
    try:
        return privacy_report(skeleton, files, query, ids, job, parties)
    except Exception as e:  # noqa: BLE001 - any failure of a measurement, named in the report
        return failure_report(skeleton, job.spec.metric, e)


def clear(scratch: Path) -> None:
    """Remove the release's working files."""
    shutil.rmtree(scratch, ignore_errors=True)
