"""Computing a queued linkage job (the worker's half of linkage_server.jobs.JobStore): the
noise-free top-K search per secondary by resumable chunks on disk, the release written chunk by
chunk (linkage_server.release_files), then its privacy report. The files it reads and writes are
the job folder's (layout: linkage_server.jobs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
import traceback
from pathlib import Path

import numpy as np

from linkage.approx import sample_rows, tie_aware_recall
from linkage.contracts import Defences, LinkageError
from linkage.job import JobSpec
from linkage.job_secret import SecretError, operator_secret, read_secret
from linkage.pipeline import check_identifiers, under_floor
from linkage.protection import chained, record, resolve
from linkage_server.chunk_search import ChunkFiles, PartySearch, cache_key, chunked_search, fresh_cache
from linkage_server.limits import cell_cost
from linkage_server.params import JobError, JobParams
from linkage_server.release_files import Job, clear, safe_privacy_report, write_release
from linkage_server.uploads import UploadError

SECRET = "secret.key"  # the job's randomness (linkage.job_secret); the service's only
TRAIN_ROWS = "train-rows.npy"  # beside job.json: no party name can collide with it


def upload_digest(meta: dict, folder: Path, party: str) -> str:
    """sha256 of a party's stored upload: recorded at upload time; read from the file only for a
    job uploaded before digests were recorded."""
    recorded = meta["uploads"][party].get("sha256")
    if recorded:
        return recorded
    h = hashlib.sha256()
    with open(folder / "uploads" / f"{party}.npy", "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def searched_layout(spec: JobSpec, secondaries: list[str]) -> tuple[str, list[str]]:
    """The chain's anchor (checked to be a secondary when the job chains) and the secondaries
    whose identifiers are searched."""
    anchor = spec.anchor_of(secondaries)
    if spec.chain and anchor not in secondaries:
        raise LinkageError(f"chain anchor {anchor!r} is not one of the secondaries {secondaries}")
    return anchor, spec.searched(secondaries)


def link_stats(skeleton) -> dict:
    """job.json's "stats": each link's noise and similarity summary."""
    return {
        p: {"sigma": lk.sigma, "sim_mean": lk.sim_mean, "sim_std": lk.sim_std, "dp_sigma_eps1": lk.dp_sigma}
        for p, lk in skeleton.primary.links.items()
    }


class JobRunner:
    """The computation of one store's jobs (``store``, a linkage_server.jobs.JobStore): it reads
    and records a job through the store's ledger (``claim``, ``tick``, ``update``, ``folder``,
    ``meta``) and sizes it by the store's ``limits``, ``chunk_rows``, ``ray``, ``operator_seed``
    and ``floors``."""

    def __init__(self, store) -> None:
        self.store = store

    def run(self, job: str) -> None:
        """Compute a queued job: resumable chunked search per secondary, then the release, written
        chunk by chunk (linkage_server.release_files), then its privacy report."""
        meta = self.store.claim(job)
        if meta is None:
            return
        params, folder = JobParams(**meta["params"]), self.store.folder(job)
        scratch = folder / "work" / ".release"  # no party's name: a name starts with a letter or digit
        try:
            self._compute(job, meta, params, folder, scratch)
        except (LinkageError, UploadError, JobError, SecretError) as e:
            self.store.update(job, state="failed", error=str(e))
        except Exception as e:  # keep the service alive; report the failure to the parties
            self.store.update(job, state="failed", error=f"internal error: {type(e).__name__}: {e}")
            traceback.print_exc()
        finally:
            clear(scratch)

    def _compute(self, job: str, meta: dict, params: JobParams, folder: Path, scratch: Path) -> None:
        """The search, the release and its privacy report; job.json "done" with their timings."""
        t0, carried = time.perf_counter(), meta.get("searched_seconds", 0.0)  # an earlier process's search
        query = np.load(folder / "uploads" / f"{meta['primary']}.npy", allow_pickle=False)
        train_rows = self._train_rows_of(folder, meta, len(query))
        cost = max(params.k, params.pool) * cell_cost(meta)  # a row's cost: long strings make a chunk fewer rows
        step = self.store.limits.chunk_rows(
            self.store.chunk_rows, int(min(cost, 2**62))
        )  # rows x pool x cost bounded: a
        # cancel waits at most one such chunk
        chunks = [(lo, min(lo + step, len(query))) for lo in range(0, len(query), step)]
        anchor, searched = searched_layout(params.spec(), meta["secondaries"])
        tick = self._progress(job, len(chunks) * len(searched), lambda: carried + time.perf_counter() - t0)
        ids = {p: np.load(folder / "uploads" / f"{p}.npy", allow_pickle=False) for p in meta["secondaries"]}
        spec = params.spec(self._defences(job, meta, params, ids, anchor))  # as the in-process linker names it
        secret = self.secret(meta, spec, query, ids, train_rows)  # also draws the recall sample
        found, recalls = {}, {}
        for party in searched:
            found[party], recalls[party] = self._party_search(
                meta, folder, query, ids[party], params, chunks, party, tick, secret
            )
        t1 = time.perf_counter()
        done = Job(job, spec, secret, train_rows, recalls, (anchor, ids) if spec.chain else None, step)
        sizes = {p: len(ids[p]) for p in searched}
        skeleton, files = write_release(folder / "results", scratch, found, sizes, query, done)
        stats, t2 = link_stats(skeleton), time.perf_counter()
        privacy = safe_privacy_report(skeleton, files, query, ids, done, spec.attacked(meta["secondaries"]))
        privacy["protection"] = self.store.meta(job)["protection"]
        self.store.update(
            job,
            state="done",
            stats=stats,
            privacy=privacy,
            seconds={"search": carried + t1 - t0, "release": t2 - t1, "privacy": time.perf_counter() - t2},
        )

    def _progress(self, job: str, total: int, searched):
        """The total of chunks recorded now (before the first one ends); returns the ``tick()``
        each finished chunk calls, with the search's seconds so far from ``searched()``."""
        steps = iter(range(1, total + 1))
        self.store.update(job, progress={"done": 0, "total": total})

        def tick() -> None:
            self.store.tick(job, next(steps), total, searched())

        return tick

    @staticmethod
    def _train_rows_of(folder: Path, meta: dict, m: int) -> np.ndarray | None:
        """The primary's training rows, if it sent them, checked against its m records."""
        if not meta.get("train_rows"):
            return None
        if not (folder / TRAIN_ROWS).exists():
            raise LinkageError(f"the primary's training rows are missing from {folder}: upload them again")
        rows = np.load(folder / TRAIN_ROWS)
        if rows.min() < 0 or rows.max() >= m:
            raise LinkageError(f"training rows must lie in [0, {m}) for the primary's {m} rows")
        return rows

    def _defences(self, job: str, meta: dict, params: JobParams, ids: dict, anchor: str) -> Defences:
        """The job's defences from the secondaries' floors and their identifiers (linkage.protection),
        recorded in job.json ("defences", and "protection": what each secondary's records got)."""
        floors = self.store.floors.of(meta)
        if params.layout == "chain":
            floors = chained(floors, anchor)
        defences = resolve(floors, ids, params.metric, radius=params.radius, compose=params.compose, tau=params.bound)
        levels = self.store.floors.levels(meta)
        self.store.update(
            job,
            defences=dataclasses.asdict(defences),
            protection=record({p: levels.get(p, "strictest of the chain") for p in floors}, floors, defences),
        )
        return defences

    def secret(self, meta: dict, spec: JobSpec, query: np.ndarray, ids: dict, train_rows: np.ndarray | None) -> bytes:
        """The job's secret; under an operator seed, derived from the seed and the job's content
        (the same content id as the in-process linker's, so both release alike): query and the
        secondaries' identifiers ``ids`` as uploaded."""
        if self.store.operator_seed is None:
            return read_secret(self.store.folder(meta["job"]) / SECRET)
        return operator_secret(self.store.operator_seed, spec.content_id(query, ids, train_rows))

    def _party_search(
        self,
        meta: dict,
        folder: Path,
        query,
        base,
        params: JobParams,
        chunks: list[tuple[int, int]],
        party: str,
        tick,
        secret: bytes,
    ) -> tuple[ChunkFiles, float]:
        """One secondary's noise-free top-pool search, by resumable chunks on disk, and its recall:
        1 when exact; an approximate one's (linkage.approx) measured on a sample drawn from the
        job's ``secret`` (no party can predict it), refused under the floor."""
        query, base = check_identifiers(query, base, params.k, party, params.metric)
        pool = min(max(params.pool, params.k), len(base))
        approx = params.approx().resolve(params.metric, len(query), len(base), base.shape[-1] if base.ndim > 1 else 1)
        key = cache_key(
            upload_digest(meta, folder, meta["primary"]),
            upload_digest(meta, folder, party),
            params.metric,
            pool,
            approx.tag(),
        )
        search = PartySearch(party, base, params.metric, pool, approx)
        found = chunked_search(fresh_cache(folder / "work" / party, key), query, search, chunks, tick, self.store.ray)
        if approx.method == "exact":
            return found, 1.0
        rows = sample_rows(len(query), approx, secret, party)
        recall = tie_aware_recall(params.metric, query[rows], base, pool, found.distances(rows), np.arange(len(rows)))
        return found, under_floor(recall, approx, party, pool, len(query))
