"""Computing a queued linkage job (the worker's half of linkage_server.jobs.JobStore): the
noise-free top-K search per secondary by resumable chunks on disk, the release written chunk by
chunk (linkage_server.release_files), then its privacy report. The files it reads and writes are
the job folder's (layout: linkage_server.jobs).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from linkage.contracts import Defences, LinkageError
from linkage.job import JobSpec
from linkage.job_secret import SecretError, operator_secret, read_secret
from linkage.protection import chained, record, resolve
from linkage.runner import JobInputs, PartySearch, layout, run_topk
from linkage_server.chunk_search import ChunkFiles, cache_key, chunked_search, fresh_cache
from linkage_server.limits import cell_cost
from linkage_server.params import JobError, JobParams
from linkage_server.release_files import FileRelease, clear
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


@dataclass(frozen=True)
class OnDisk:
    """Where a job's searches keep their chunks: its job.json (``meta``: the uploads' digests), its
    folder, the chunks of primary rows, and the ``tick()`` each finished chunk calls."""

    meta: dict
    folder: Path
    chunks: tuple[tuple[int, int], ...]
    tick: Callable[[], None]


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
        """The search, the release (linkage.runner.run_topk, as in one process, here with the
        search's chunks on disk and the release written to files) and its privacy report; job.json
        "done" with their timings."""
        t0, carried = time.perf_counter(), meta.get("searched_seconds", 0.0)  # an earlier process's search
        query = np.load(folder / "uploads" / f"{meta['primary']}.npy", allow_pickle=False)
        train_rows = self._train_rows_of(folder, meta, len(query))
        cost = max(params.k, params.pool) * cell_cost(meta)  # a row's cost: long strings make a chunk fewer rows
        step = self.store.limits.chunk_rows(
            self.store.chunk_rows, int(min(cost, 2**62))
        )  # rows x pool x cost bounded: a
        # cancel waits at most one such chunk
        chunks = [(lo, min(lo + step, len(query))) for lo in range(0, len(query), step)]
        anchor, searched = layout(params.spec(), meta["secondaries"])
        tick = self._progress(job, len(chunks) * len(searched), lambda: carried + time.perf_counter() - t0)
        ids = {p: np.load(folder / "uploads" / f"{p}.npy", allow_pickle=False) for p in meta["secondaries"]}
        spec = params.spec(self._defences(job, meta, params, ids, anchor))  # as the in-process linker names it
        secret = self.secret(meta, spec, query, ids, train_rows)  # also keys the recall sample
        searches = functools.partial(self._party_search, OnDisk(meta, folder, tuple(chunks), tick))
        files, marks = FileRelease(folder / "results", scratch, step), {}

        def write(*args):
            marks["release"] = time.perf_counter()  # the search is done
            return files(*args)

        skeleton, released = run_topk(spec, JobInputs(query, ids, train_rows), secret, job, searches, write)
        stats, t1, t2 = link_stats(skeleton), marks["release"], time.perf_counter()
        privacy = files.privacy_report(skeleton, released, query, ids, secret, spec.attacked(meta["secondaries"]))
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

    def _party_search(self, job: OnDisk, query, search: PartySearch) -> ChunkFiles:
        """One secondary's noise-free top-pool search (the runner's ``searches``), by resumable
        chunks on disk named for both uploads and the search, here or on the store's Ray."""
        meta, folder = job.meta, job.folder
        key = cache_key(
            upload_digest(meta, folder, meta["primary"]),
            upload_digest(meta, folder, search.party),
            search.metric,
            search.k,
            search.approx.tag(),
        )
        cache = fresh_cache(folder / "work" / search.party, key)
        return chunked_search(cache, query, search, list(job.chunks), job.tick, self.store.ray)
