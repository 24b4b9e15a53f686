"""A job's release written to disk chunk by chunk: the service's memory is bounded by a chunk,
whatever the number of primary records.

    FileRelease(results, scratch)(searched {party: ChunkFiles}, sizes, query, Release) -> (skeleton, files)
        (the runner's ``write`` for the service: linkage.runner.run_topk)

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
from linkage.privacy import MAX_TOKENS, attacked_tokens, failure_report
from linkage.privacy import privacy_report as report
from linkage.release import PartyPlan, Release, plan_parties
from linkage.runner import chain_to
from linkage.store import NpyWriter, npy_chunks, primary_meta, secondary_bytes, write_npz
from linkage_server.chunk_search import ChunkFiles


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


def _skeleton(plans: dict[str, PartyPlan], job: Release, query) -> LinkageResult:
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


@dataclass(frozen=True)
class FileRelease:
    """The release written under ``results`` (its rows' working files under ``scratch``, removed
    by the caller): the service's ``write`` for linkage.runner.run_topk."""

    results: Path
    scratch: Path
    step: int = 20_000  # rows read at a time from the released files (the privacy report's)

    def __call__(
        self, searched: dict[str, ChunkFiles], sizes: dict[str, int], query, job: Release
    ) -> tuple[LinkageResult, dict[str, tuple[Path, Path]]]:
        """Release every searched party (module docstring); returns the skeleton and, per party of
        the release, its (tokens, sims) files under ``scratch``."""
        plans = plan_parties(searched, sizes, len(query), job)  # the tokens drawn as in memory
        files = {p: _release_party(plan, searched[p], query, job.secret, self.scratch) for p, plan in plans.items()}
        skeleton = _skeleton(plans, job, query)
        source = {p: files[job.chain[0] if job.chain else p] for p in skeleton.primary.links}  # a chain: the anchor's
        members = {"meta": primary_meta(skeleton.primary)}
        for p, (tokens, sims) in source.items():
            members[f"tokens__{p}"], members[f"sims__{p}"] = tokens, sims
        write_npz(self.results / "primary.npz", members)
        for party, s in skeleton.secondaries.items():
            write_atomic(self.results / f"secondary-{party}.npz", secondary_bytes(s))
        return skeleton, source

    def privacy_report(self, skeleton: LinkageResult, files, query, ids: dict, secret: bytes, parties) -> dict:
        """The job's privacy report (linkage.privacy) from the released ``files`` (module
        docstring), or, when it fails, a report that says so (the release stands)."""
        try:
            return _privacy_report(skeleton, files, query, ids, secret, parties, self.step)
        except Exception as e:  # noqa: BLE001 - any failure of a measurement, named in the report
            return failure_report(skeleton, skeleton.primary.metric, e)


def _rows_of(path: Path, rows: np.ndarray, step: int) -> np.ndarray:
    """The given rows (ascending) of a .npy file, read a chunk at a time."""
    parts = [arr[rows[(rows >= lo) & (rows < lo + len(arr))] - lo] for lo, arr in npy_chunks(path, step)]
    return np.concatenate(parts)


def _privacy_report(skeleton: LinkageResult, files, query, ids: dict, secret: bytes, parties, step: int) -> dict:
    """The report on the records linked to the attacked tokens, reading ``step`` rows at a time."""
    own = parties or sorted(skeleton.primary.links)
    counts, keep = {}, np.zeros(len(query), bool)
    for p in own:
        row_of_token = skeleton.secondaries[p].row_of_token
        counts[p] = np.zeros(len(row_of_token), np.int64)
        for _, tokens in npy_chunks(files[p][0], step):
            counts[p] += np.bincount(tokens.ravel(), minlength=len(row_of_token))
        only = attacked_tokens(counts[p], p, row_of_token, len(ids[p]), MAX_TOKENS, secret)
        for lo, tokens in npy_chunks(files[p][0], step):
            keep[lo : lo + len(tokens)] |= np.isin(tokens, only).any(axis=1)
    rows = np.flatnonzero(keep)  # the records linked to an attacked token: every link the attacks read
    links = {
        p: dataclasses.replace(lk, tokens=_rows_of(files[p][0], rows, step), sims=_rows_of(files[p][1], rows, step))
        if p in own
        else lk
        for p, lk in skeleton.primary.links.items()
    }
    restricted = dataclasses.replace(skeleton, primary=dataclasses.replace(skeleton.primary, links=links))
    metric = skeleton.primary.metric
    return report(restricted, query[rows], ids, metric, parties=parties, counts=counts, secret=secret)


def clear(scratch: Path) -> None:
    """Remove the release's working files."""
    shutil.rmtree(scratch, ignore_errors=True)
