"""Linkage jobs on disk, their parties' secrets, and the worker that computes them.

Layout under ``<data-dir>/jobs/<job>/``::

    job.json                  parties, secret hashes, state, parameters, progress, timings, and
                              "queried": the records its queries used (linkage_server.queries)
    secret.key                the job's randomness (0600; linkage.job_secret), never served
    uploads/<party>.npy       one party's identifiers (readable by the service only)
    train-rows.npy            the primary's training rows (optional; standardisation)
    work/<party>/<key>/<lo>-<hi>.npz  finished chunks of the (noise-free) top-K search: the resume
                              points; <key> hashes both uploads' bytes and metric/pool (:func:`cache_key`)
    results/primary.npz, results/secondary-<party>.npz   what each party downloads

Every file is written to a temporary name and renamed, so a killed service leaves either the old
or the new file. A service restarted on the same folder re-queues the jobs that were queued or
running and skips the chunks already done.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
import traceback
from pathlib import Path

import numpy as np

from linkage.approx import sample_rows, tie_aware_recall
from linkage.contracts import LinkageError
from linkage.job_secret import (
    SecretError,
    new_secret,
    operator_secret,
    read_secret,
    write_secret,
)
from linkage.pipeline import check_identifiers, under_floor
from linkage.private import private_dir
from linkage.store import write_atomic
from linkage_server.chunk_search import (
    ChunkFiles,
    cache_key,
    chunked_search,
    fresh_cache,
)
from linkage_server.limits import Limits, job_cells
from linkage_server.params import (  # JobParams re-exported: the service and tests import it here
    JobError,
    JobParams,
)
from linkage_server.release_files import Job, clear, safe_privacy_report, write_release
from linkage_server.scheduler import Worker  # noqa: F401 - re-exported: the service imports it here
from linkage_server.uploads import (
    KIND_OF_METRIC,
    UploadError,
    npy_sha256,
    parse_npy,
    to_npy,
    validate,
)
from linkage_server.views import HIDDEN_FAILURE, status_view

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # whole names only: NAME.fullmatch
STATES = ("created", "queued", "running", "done", "failed")
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


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class JobStore:
    """Jobs under one data folder; thread-safe; the only code that touches the files."""

    def __init__(self, root: Path, *, max_rows: int = 50_000_000, chunk_rows: int = 20_000,
                 operator_seed: int | None = None, ray: str = "", limits: Limits = Limits()) -> None:
        self.root = Path(root) / "jobs"
        self.limits = limits  # the operator's (linkage_server.limits): K, cells per job and per chunk
        self.ray = ray  # "": search chunks in this process; "local" or an address: on Ray (chunk_search)
        self.operator_seed = operator_seed  # the operator's, for reproducible experiments; no party sees it
        private_dir(self.root)
        self.max_rows, self.chunk_rows = max_rows, chunk_rows
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ metadata
    def _dir(self, job: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{16}", job):
            raise JobError(404, f"unknown job {job!r}")
        return self.root / job

    def meta(self, job: str) -> dict:
        path = self._dir(job) / "job.json"
        if not path.exists():
            raise JobError(404, f"unknown job {job!r}")
        return json.loads(path.read_text())

    def _save(self, meta: dict) -> None:
        write_atomic(self._dir(meta["job"]) / "job.json", json.dumps(meta, indent=1).encode())

    def _update(self, job: str, **changes) -> dict:
        with self._lock:
            meta = self.meta(job)
            meta.update(changes)
            self._save(meta)
            return meta

    def create(self, primary: str, secondaries: list[str], duplicates: str = "allow") -> tuple[str, dict[str, str]]:
        """A new job; returns its id and one fresh secret per party (only their hashes are kept)."""
        parties = [primary, *secondaries]
        for name in parties:
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise JobError(422, f"bad party name {name!r}: use 1-64 letters, digits, '_', '-', '.'")
        if not secondaries:
            raise JobError(422, "a job needs at least one secondary party")
        if len({p.lower() for p in parties}) != len(parties):  # one file per party, on any filesystem
            raise JobError(422, f"party names must be distinct, ignoring case; got {parties}")
        if duplicates not in ("allow", "refuse"):
            raise JobError(422, f"duplicates must be 'allow' or 'refuse', got {duplicates!r}")
        job = secrets.token_hex(8)
        keys = {p: secrets.token_urlsafe(32) for p in parties}
        meta = {"job": job, "primary": primary, "secondaries": list(secondaries), "duplicates": duplicates,
                "secret_sha256": {p: _hash(s) for p, s in keys.items()}, "state": "created", "params": None,
                "uploads": {}, "progress": {"done": 0, "total": 0}, "error": None, "seconds": {},
                "created": time.time()}
        with self._lock:
            self._dir(job).mkdir(mode=0o700)  # private_dir made its parent (the umask may add bits: not 0700)
            os.chmod(self._dir(job), 0o700)
            write_secret(self._dir(job) / SECRET, new_secret())  # 0600, never served
            self._save(meta)
        return job, keys

    def authenticate(self, job: str, party: str, secret: str | None) -> dict:
        """The job's metadata if `secret` is this party's; otherwise 401/403/404."""
        meta = self.meta(job)
        if party not in meta["secret_sha256"]:
            raise JobError(404, f"unknown party {party!r} in job {job}")  # the job's parties stay unnamed
        if not secret:
            raise JobError(401, "missing credentials: send 'Authorization: Bearer <party secret>'")
        if not hmac.compare_digest(_hash(secret), meta["secret_sha256"][party]):
            raise JobError(403, f"wrong secret for party {party!r}")
        return meta

    def party_with_secret(self, meta: dict, secret: str) -> str | None:
        """The party of the job whose secret this is, if any (every hash compared, in constant time)."""
        digest, found = _hash(secret), None
        for party, want in meta["secret_sha256"].items():
            if hmac.compare_digest(digest, want):
                found = party
        return found

    def public(self, meta: dict, role: str = "admin", party: str | None = None) -> dict:
        """The status `role` may see (:mod:`linkage_server.views`): never a secret, hash or seed."""
        return status_view(meta, role, party)

    # ------------------------------------------------------------------ uploads
    def _open(self, job: str) -> dict:
        meta = self.meta(job)
        if meta["state"] not in ("created", "failed"):
            raise JobError(409, f"job {job} is {meta['state']}: uploads are closed once it starts")
        return meta

    def body_path(self, job: str) -> Path:
        """A fresh name for a request body streamed to disk (the service's), in the job's folder:
        an upload renames it into place, so it never passes through memory (BodyFile)."""
        return private_dir(self._dir(job) / "incoming") / f"{secrets.token_hex(8)}.npy"

    def upload(self, job: str, party: str, data: bytes | Path, *, train_rows: bool = False,
               fingerprint: str | None = None) -> dict:
        """Validate and stage the file with no lock held (other requests carry on), then commit it.
        ``data``: the .npy's bytes, or a file of them (:meth:`body_path`: validated memory-mapped,
        then renamed into place). ``fingerprint``: the encoding key's, if the party's client sent
        one (linkage_server.queries)."""
        meta = self._open(job)
        arr = parse_npy(data)
        if train_rows:
            summary, data, path = self._train_rows(meta, party, arr), to_npy(arr), self._dir(job) / TRAIN_ROWS
        else:
            checked = validate(arr, max_rows=self.max_rows)
            if meta["duplicates"] == "refuse" and checked.duplicates:
                raise UploadError(f"{checked.duplicates} duplicate identifier(s), and this job refuses duplicates")
            summary = checked.as_dict() | {"sha256": npy_sha256(data)}
            if fingerprint:
                summary["fingerprint"] = fingerprint
            path = self._dir(job) / "uploads" / f"{party}.npy"
        del arr  # a memory map of the body file
        staged = path.with_name(f"{path.name}.staged-{secrets.token_hex(6)}")
        try:
            if isinstance(data, Path):  # the streamed body: renamed, never read into memory
                os.replace(data, private_dir(staged.parent) / staged.name)
            else:
                write_atomic(staged, data)
            with self._lock:
                meta = self._open(job)
                staged.replace(path)
                if train_rows:
                    meta["train_rows"] = summary["train_rows"]
                else:
                    meta["uploads"][party] = summary
                self._save(meta)
        finally:
            staged.unlink(missing_ok=True)
        return summary

    @staticmethod
    def _train_rows(meta: dict, party: str, arr: np.ndarray) -> dict:
        if party != meta["primary"]:
            raise JobError(403, "only the primary party sends training rows")
        if arr.ndim != 1 or arr.dtype.kind not in "iu" or len(arr) == 0:
            raise UploadError(f"training rows must be a non-empty 1-D integer array; got {arr.dtype} {arr.shape}")
        return {"train_rows": int(len(arr))}

    # ------------------------------------------------------------------ start / run
    def start(self, job: str, params: JobParams) -> dict:
        with self._lock:
            meta = self.meta(job)
            if meta["state"] not in ("created", "failed"):
                raise JobError(409, f"job {job} is already {meta['state']}")
            parties = [meta["primary"], *meta["secondaries"]]
            missing = [p for p in parties if p not in meta["uploads"]]
            if missing:
                raise JobError(409, f"waiting for uploads from {missing}")
            kinds = {p: meta["uploads"][p]["kind"] for p in parties}
            want = KIND_OF_METRIC[params.metric]
            wrong = {p: k for p, k in kinds.items() if k != want}
            if wrong:
                raise JobError(422, f"metric {params.metric!r} needs {want} identifiers; got {wrong}")
            for p in meta["secondaries"]:
                rows = meta["uploads"][p]["rows"]
                if params.k > rows:
                    raise JobError(422, f"K={params.k} must be between 1 and the size of party {p!r} ({rows} rows)")
            self.limits.check_job(meta, params)  # K and the job's cells, before it is queued
            return self._update(job, state="queued", params=params.__dict__, error=None, cancel=None,
                                progress={"done": 0, "total": 0}, searched_seconds=0.0)

    def cells(self, job: str) -> int:
        """The job's size in cells (linkage_server.limits.job_cells): the scheduler's lane."""
        meta = self.meta(job)
        return job_cells(meta, JobParams(**meta["params"]))

    def cancel(self, job: str, by: str) -> dict:
        """Cancel a queued job now (the worker skips it), or a running one at its next chunk
        boundary; either ends "failed" with the error "cancelled by <by>". 409 for any other state."""
        with self._lock:
            meta = self.meta(job)
            if meta["state"] == "queued":
                meta.update(state="failed", error=f"cancelled by {by}", cancel=None)
            elif meta["state"] == "running":
                meta["cancel"] = by  # read by the job at its next chunk (JobStore.run's tick)
            else:
                raise JobError(409, f"job {job} is {meta['state']}: only a queued or running job can be cancelled")
            self._save(meta)
            return meta

    def _claim(self, job: str) -> dict | None:
        """The job's metadata, marked running, if it is queued (or was running when a previous
        process stopped); None when it is not to run: cancelled while queued, or finished."""
        with self._lock:
            meta = self.meta(job)
            if meta["state"] not in ("queued", "running"):
                return None
            if meta.get("cancel"):  # cancelled while running, and the service stopped before it ended
                meta.update(state="failed", error=f"cancelled by {meta['cancel']}", cancel=None)
                self._save(meta)
                return None
            meta["state"] = "running"
            self._save(meta)
            return meta

    def _tick(self, job: str, done: int, total: int, searched: float) -> None:
        """One chunk done: the progress and the search's seconds so far (over every process that
        ran the job: a resumed job counts its earlier ones) saved; stopped here if cancelled."""
        meta = self._update(job, progress={"done": done, "total": total}, searched_seconds=searched)
        if meta.get("cancel"):
            raise JobError(409, f"cancelled by {meta['cancel']}")

    def pending(self) -> list[str]:
        """Jobs queued or interrupted while running, oldest first (resumed after a restart)."""
        metas = [json.loads(p.read_text()) for p in self.root.glob("*/job.json")]
        return [m["job"] for m in sorted(metas, key=lambda m: m["created"]) if m["state"] in ("queued", "running")]

    def run(self, job: str) -> None:
        """Compute a queued job: resumable chunked search per secondary, then the release, written
        chunk by chunk (linkage_server.release_files), then its privacy report."""
        meta = self._claim(job)
        if meta is None:
            return
        params, folder = JobParams(**meta["params"]), self._dir(job)
        scratch = folder / "work" / ".release"  # no party's name: a name starts with a letter or digit
        try:
            t0, carried = time.perf_counter(), meta.get("searched_seconds", 0.0)  # an earlier process's search
            query = np.load(folder / "uploads" / f"{meta['primary']}.npy", allow_pickle=False)
            train_rows = self._train_rows_of(folder, meta, len(query))
            step = self.limits.chunk_rows(self.chunk_rows, max(params.k, params.pool))  # rows x pool bounded
            chunks = [(lo, min(lo + step, len(query))) for lo in range(0, len(query), step)]
            spec = params.spec()  # the job as the in-process linker names it (linkage.job)
            anchor = spec.anchor_of(meta["secondaries"])
            if spec.chain and anchor not in meta["secondaries"]:
                raise LinkageError(f"chain anchor {anchor!r} is not one of the secondaries {meta['secondaries']}")
            searched = spec.searched(meta["secondaries"])
            total = len(chunks) * len(searched)
            steps = iter(range(1, total + 1))
            self._update(job, progress={"done": 0, "total": total})  # the total known before the first chunk ends

            def tick() -> None:
                self._tick(job, next(steps), total, carried + time.perf_counter() - t0)

            ids = {p: np.load(folder / "uploads" / f"{p}.npy", allow_pickle=False) for p in meta["secondaries"]}
            secret = self._secret(meta, params, query, ids, train_rows)  # also draws the recall sample
            found, recalls, sizes = {}, {}, {}
            for party in searched:
                found[party], recalls[party] = self._party_search(meta, folder, query, ids[party], params, chunks,
                                                                  party, tick, secret)
                sizes[party] = len(ids[party])
            t1 = time.perf_counter()
            done = Job(job, params.k, params.tau, params.metric, secret, train_rows, params.defences(), recalls,
                       (anchor, ids) if spec.chain else None, step)
            skeleton, files = write_release(folder / "results", scratch, found, sizes, query, done)
            stats = {p: {"sigma": lk.sigma, "sim_mean": lk.sim_mean, "sim_std": lk.sim_std, "dp_sigma_eps1": lk.dp_sigma}
                     for p, lk in skeleton.primary.links.items()}
            t2 = time.perf_counter()
            privacy = safe_privacy_report(skeleton, files, query, ids, done, spec.attacked(meta["secondaries"]))
            self._update(job, state="done", stats=stats, privacy=privacy,
                         seconds={"search": carried + t1 - t0, "release": t2 - t1, "privacy": time.perf_counter() - t2})
        except (LinkageError, UploadError, JobError, SecretError) as e:
            self._update(job, state="failed", error=str(e))
        except Exception as e:  # keep the service alive; report the failure to the parties
            self._update(job, state="failed", error=f"internal error: {type(e).__name__}: {e}")
            traceback.print_exc()
        finally:
            clear(scratch)

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

    def _secret(self, meta: dict, params: JobParams, query: np.ndarray, ids: dict,
                train_rows: np.ndarray | None) -> bytes:
        """The job's secret; under an operator seed, derived from the seed and the job's content
        (the same content id as the in-process linker's, so both release alike): query and the
        secondaries' identifiers ``ids`` as uploaded."""
        if self.operator_seed is None:
            return read_secret(self._dir(meta["job"]) / SECRET)
        return operator_secret(self.operator_seed, params.spec().content_id(query, ids, train_rows))

    def _party_search(self, meta: dict, folder: Path, query, base, params: JobParams, chunks: list[tuple[int, int]],
                      party: str, tick, secret: bytes) -> tuple[ChunkFiles, float]:
        """One secondary's noise-free top-pool search, by resumable chunks on disk, and its recall:
        1 when exact; an approximate one's (linkage.approx) measured on a sample drawn from the
        job's ``secret`` (no party can predict it), refused under the floor."""
        query, base = check_identifiers(query, base, params.k, party, params.metric)
        pool = min(max(params.pool, params.k), len(base))
        approx = params.approx().resolve(params.metric, len(query), len(base), base.shape[-1] if base.ndim > 1 else 1)
        key = cache_key(upload_digest(meta, folder, meta["primary"]), upload_digest(meta, folder, party),
                        params.metric, pool, approx.tag())
        found = chunked_search(fresh_cache(folder / "work" / party, key), query, base, params.metric, pool, party,
                               chunks, tick, self.ray, approx)
        if approx.method == "exact":
            return found, 1.0
        rows = sample_rows(len(query), approx, secret, party)
        recall = tie_aware_recall(params.metric, query[rows], base, pool, found.distances(rows), np.arange(len(rows)))
        return found, under_floor(recall, approx, party, pool, len(query))

    def result_path(self, job: str, party: str) -> Path:
        meta = self.meta(job)
        if meta["state"] != "done":  # the error only for the primary (it may name other parties)
            shown = meta.get("error") if party == meta["primary"] else (meta.get("error") and HIDDEN_FAILURE)
            raise JobError(409, f"job {job} is {meta['state']}: no result yet" + (f" ({shown})" if shown else ""))
        name = "primary.npz" if party == meta["primary"] else f"secondary-{party}.npz"
        return self._dir(job) / "results" / name
