"""Linkage jobs on disk and their parties' secrets; computing a job is linkage_server.job_run's.

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
from pathlib import Path

import numpy as np

from files.atomic import write_atomic
from files.private import private_dir
from linkage.contracts import party_names_problem
from linkage.job_secret import new_secret, write_secret
from linkage_server.floors import Floors, parse_floor
from linkage_server.job_run import SECRET, TRAIN_ROWS, JobRunner
from linkage_server.limits import Limits, job_cost
from linkage_server.params import (  # JobParams re-exported: the service and tests import it here
    JobError,
    JobParams,
)
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

STATES = ("created", "queued", "running", "done", "failed")


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class JobStore:
    """Jobs under one data folder; thread-safe; the only code that touches the files. Computing
    a job (:meth:`run`) is linkage_server.job_run's JobRunner, over this store's ledger."""

    def __init__(
        self,
        root: Path,
        *,
        max_rows: int = 50_000_000,
        chunk_rows: int = 20_000,
        operator_seed: int | None = None,
        ray: str = "",
        limits: Limits = Limits(),
        floors: Floors | None = None,
    ) -> None:
        self.root = Path(root) / "jobs"
        self.limits = limits  # the operator's (linkage_server.limits): K, cells per job and per chunk
        self.floors = floors or Floors()  # the operator's privacy floor, and each secondary's (linkage_server.floors)
        self.ray = ray  # "": search chunks in this process; "local" or an address: on Ray (chunk_search)
        self.operator_seed = operator_seed  # the operator's, for reproducible experiments; no party sees it
        private_dir(self.root)
        self.max_rows, self.chunk_rows = max_rows, chunk_rows
        self.lock = threading.RLock()

    # ------------------------------------------------------------------ metadata
    def run(self, job: str) -> None:
        """Compute a queued job (linkage_server.job_run.JobRunner)."""
        JobRunner(self).run(job)

    def folder(self, job: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{16}", job):
            raise JobError(404, f"unknown job {job!r}")
        return self.root / job

    def meta(self, job: str) -> dict:
        path = self.folder(job) / "job.json"
        if not path.exists():
            raise JobError(404, f"unknown job {job!r}")
        return json.loads(path.read_text())

    def save(self, meta: dict) -> None:
        write_atomic(self.folder(meta["job"]) / "job.json", json.dumps(meta, indent=1).encode())

    def update(self, job: str, **changes) -> dict:
        with self.lock:
            meta = self.meta(job)
            meta.update(changes)
            self.save(meta)
            return meta

    def create(self, primary: str, secondaries: list[str], duplicates: str = "allow") -> tuple[str, dict[str, str]]:
        """A new job; returns its id and one fresh secret per party (only their hashes are kept)."""
        parties = [primary, *secondaries]
        if party_names_problem(parties):
            raise JobError(422, party_names_problem(parties))
        if not secondaries:
            raise JobError(422, "a job needs at least one secondary party")
        if duplicates not in ("allow", "refuse"):
            raise JobError(422, f"duplicates must be 'allow' or 'refuse', got {duplicates!r}")
        job = secrets.token_hex(8)
        keys = {p: secrets.token_urlsafe(32) for p in parties}
        meta = {
            "job": job,
            "primary": primary,
            "secondaries": list(secondaries),
            "duplicates": duplicates,
            "secret_sha256": {p: _hash(s) for p, s in keys.items()},
            "state": "created",
            "params": None,
            "uploads": {},
            "progress": {"done": 0, "total": 0},
            "error": None,
            "seconds": {},
            "created": time.time(),
        }
        with self.lock:
            self.folder(job).mkdir(mode=0o700)  # private_dir made its parent (the umask may add bits: not 0700)
            os.chmod(self.folder(job), 0o700)
            write_secret(self.folder(job) / SECRET, new_secret())  # 0600, never served
            self.save(meta)
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
        return private_dir(self.folder(job) / "incoming") / f"{secrets.token_hex(8)}.npy"

    def upload(
        self, job: str, party: str, data: bytes | Path, *, train_rows: bool = False, fingerprint: str | None = None
    ) -> dict:
        """Validate and stage the file with no lock held (other requests carry on), then commit it.
        ``data``: the .npy's bytes, or a file of them (:meth:`body_path`: validated memory-mapped,
        then renamed into place). ``fingerprint``: the encoding key's, if the party's client sent
        one (linkage_server.queries)."""
        meta = self._open(job)
        arr = parse_npy(data)
        if train_rows:
            summary, data, path = self._train_rows(meta, party, arr), to_npy(arr), self.folder(job) / TRAIN_ROWS
        else:
            checked = validate(arr, max_rows=self.max_rows)
            if meta["duplicates"] == "refuse" and checked.duplicates:
                raise UploadError(f"{checked.duplicates} duplicate identifier(s), and this job refuses duplicates")
            summary = checked.as_dict() | {"sha256": npy_sha256(data)}
            if fingerprint:
                summary["fingerprint"] = fingerprint
            path = self.folder(job) / "uploads" / f"{party}.npy"
        del arr  # a memory map of the body file
        staged = path.with_name(f"{path.name}.staged-{secrets.token_hex(6)}")
        try:
            if isinstance(data, Path):  # the streamed body: renamed, never read into memory
                os.replace(data, private_dir(staged.parent) / staged.name)
            else:
                write_atomic(staged, data)
            with self.lock:
                meta = self._open(job)
                staged.replace(path)
                if train_rows:
                    meta["train_rows"] = summary["train_rows"]
                else:
                    meta["uploads"][party] = summary
                self.save(meta)
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

    def set_floor(self, job: str, party: str, body) -> dict:
        """A secondary's privacy floor for its records (linkage_server.floors), while uploads are open."""
        level, floor = parse_floor(body)
        with self.lock:
            meta = self._open(job)
            if party not in meta["secondaries"]:
                raise JobError(403, "only a secondary party states a privacy floor (for its own records)")
            meta.setdefault("floors", {})[party] = {"level": level, "floor": floor.as_dict()}
            self.save(meta)
        got = self.floors.of(meta)[party]
        return {"party": party, "level": level, "stated": floor.as_dict(), "effective": got.as_dict()}

    # ------------------------------------------------------------------ start / cancel
    def start(self, job: str, params: JobParams) -> dict:
        with self.lock:
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
            floors = self.floors.check_start(meta, params)  # a request for less than a floor: refused by name
            params = params.with_pool(0.0 < params.tau < 1.0 or any(f.noisy for f in floors.values()))
            self.limits.check_job(meta, params)  # K and the job's cells, before it is queued
            return self.update(
                job,
                state="queued",
                params=params.__dict__,
                error=None,
                cancel=None,
                progress={"done": 0, "total": 0},
                searched_seconds=0.0,
            )

    def cells(self, job: str) -> float:
        """The job's cost in coordinate cells (linkage_server.limits.job_cost): the scheduler's lane."""
        meta = self.meta(job)
        return job_cost(meta, JobParams(**meta["params"]))

    def cancel(self, job: str, by: str) -> dict:
        """Cancel a queued job now (the worker skips it), or a running one at its next chunk
        boundary; either ends "failed" with the error "cancelled by <by>". 409 for any other state."""
        with self.lock:
            meta = self.meta(job)
            if meta["state"] == "queued":
                meta.update(state="failed", error=f"cancelled by {by}", cancel=None)
            elif meta["state"] == "running":
                meta["cancel"] = by  # read by the job at its next chunk (JobStore.run's tick)
            else:
                raise JobError(409, f"job {job} is {meta['state']}: only a queued or running job can be cancelled")
            self.save(meta)
            return meta

    def claim(self, job: str) -> dict | None:
        """The job's metadata, marked running, if it is queued (or was running when a previous
        process stopped); None when it is not to run: cancelled while queued, or finished."""
        with self.lock:
            meta = self.meta(job)
            if meta["state"] not in ("queued", "running"):
                return None
            if meta.get("cancel"):  # cancelled while running, and the service stopped before it ended
                meta.update(state="failed", error=f"cancelled by {meta['cancel']}", cancel=None)
                self.save(meta)
                return None
            meta["state"] = "running"
            self.save(meta)
            return meta

    def tick(self, job: str, done: int, total: int, searched: float) -> None:
        """One chunk done: the progress and the search's seconds so far (over every process that
        ran the job: a resumed job counts its earlier ones) saved; stopped here if cancelled."""
        meta = self.update(job, progress={"done": done, "total": total}, searched_seconds=searched)
        if meta.get("cancel"):
            raise JobError(409, f"cancelled by {meta['cancel']}")

    def pending(self) -> list[str]:
        """Jobs queued or interrupted while running, oldest first (resumed after a restart)."""
        metas = [json.loads(p.read_text()) for p in self.root.glob("*/job.json")]
        return [m["job"] for m in sorted(metas, key=lambda m: m["created"]) if m["state"] in ("queued", "running")]

    def result_path(self, job: str, party: str) -> Path:
        meta = self.meta(job)
        if meta["state"] != "done":  # the error only for the primary (it may name other parties)
            shown = meta.get("error") if party == meta["primary"] else (meta.get("error") and HIDDEN_FAILURE)
            raise JobError(409, f"job {job} is {meta['state']}: no result yet" + (f" ({shown})" if shown else ""))
        name = "primary.npz" if party == meta["primary"] else f"secondary-{party}.npz"
        return self.folder(job) / "results" / name
