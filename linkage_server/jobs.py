"""Linkage jobs on disk, their parties' secrets, and the worker that computes them.

Layout under ``<data-dir>/jobs/<job>/``::

    job.json                  parties, secret hashes, state, parameters, progress, timings
    uploads/<party>.npy       one party's identifiers (readable by the service only)
    uploads/<party>.train.npy the primary's training rows (optional; standardisation)
    work/<party>/<lo>-<hi>.npz  finished chunks of the (noise-free) top-K search: the resume points
    results/primary.npz, results/secondary-<party>.npz   what each party downloads

Every file is written to a temporary name and renamed, so a killed service leaves either the old
or the new file. A service restarted on the same folder re-queues the jobs that were queued or
running and skips the chunks already done.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import re
import secrets
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from linkage_server.pipeline import METRICS, LinkageError, chain_to, check_identifiers, release, search
from linkage_server.store import npz_bytes, primary_bytes, secondary_bytes, write_atomic
from linkage_server.uploads import KIND_OF_METRIC, UploadError, parse_npy, to_npy, validate

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
STATES = ("created", "queued", "running", "done", "failed")


class JobError(Exception):
    """A request the job cannot honour. status: the HTTP status the service answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class JobParams:
    metric: str
    k: int
    tau: float = 1.0
    seed: int = 0
    pool: int = 0  # candidates per record before noise; 0 = K (select, then noise)
    layout: str = "independent"  # or "chain": paper App. C, secondaries linked one-to-one to `anchor`
    anchor: str = ""  # the chain's anchor secondary; "" = the first by name

    @classmethod
    def parse(cls, body: dict) -> "JobParams":
        known = {"metric", "k", "tau", "seed", "pool", "layout", "anchor"}
        unknown = sorted(set(body) - known)
        if unknown:
            raise JobError(422, f"unknown job parameter(s) {unknown}; known: {sorted(known)}")
        try:
            p = cls(metric=str(body["metric"]), k=int(body["k"]), tau=float(body.get("tau", 1.0)),
                    seed=int(body.get("seed", 0)), pool=int(body.get("pool", 0)),
                    layout=str(body.get("layout", "independent")), anchor=str(body.get("anchor", "")))
        except KeyError as e:
            raise JobError(422, f"missing job parameter {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise JobError(422, f"bad job parameter: {e}") from None
        if p.metric not in METRICS:
            raise JobError(422, f"unknown metric {p.metric!r}; known: {list(METRICS)}")
        if p.k < 1:
            raise JobError(422, f"k must be >= 1, got {p.k}")
        if p.layout not in ("independent", "chain"):
            raise JobError(422, f"layout must be 'independent' or 'chain', got {p.layout!r}")
        if not 0.0 < p.tau <= 1.0:
            raise JobError(422, f"tau must be in (0, 1], got {p.tau}")
        if p.pool and p.pool < p.k:
            raise JobError(422, f"pool ({p.pool}) must be 0 or >= k ({p.k})")
        return p


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class JobStore:
    """Jobs under one data folder; thread-safe; the only code that touches the files."""

    def __init__(self, root: Path, *, max_rows: int = 50_000_000, chunk_rows: int = 20_000) -> None:
        self.root = Path(root) / "jobs"
        self.root.mkdir(parents=True, exist_ok=True)
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
            if not isinstance(name, str) or not NAME.match(name):
                raise JobError(422, f"bad party name {name!r}: use 1-64 letters, digits, '_', '-', '.'")
        if not secondaries:
            raise JobError(422, "a job needs at least one secondary party")
        if len(set(parties)) != len(parties):
            raise JobError(422, f"party names must be distinct; got {parties}")
        if duplicates not in ("allow", "refuse"):
            raise JobError(422, f"duplicates must be 'allow' or 'refuse', got {duplicates!r}")
        job = secrets.token_hex(8)
        keys = {p: secrets.token_urlsafe(32) for p in parties}
        meta = {"job": job, "primary": primary, "secondaries": list(secondaries), "duplicates": duplicates,
                "secret_sha256": {p: _hash(s) for p, s in keys.items()}, "state": "created", "params": None,
                "uploads": {}, "progress": {"done": 0, "total": 0}, "error": None, "seconds": {},
                "created": time.time()}
        with self._lock:
            self._dir(job).mkdir(parents=True)
            self._save(meta)
        return job, keys

    def authenticate(self, job: str, party: str, secret: str | None) -> dict:
        """The job's metadata if `secret` is this party's; otherwise 401/403/404."""
        meta = self.meta(job)
        if party not in meta["secret_sha256"]:
            raise JobError(404, f"unknown party {party!r} in job {job}; parties: "
                                f"{[meta['primary'], *meta['secondaries']]}")
        if not secret:
            raise JobError(401, "missing credentials: send 'Authorization: Bearer <party secret>'")
        if not hmac.compare_digest(_hash(secret), meta["secret_sha256"][party]):
            raise JobError(403, f"wrong secret for party {party!r}")
        return meta

    def public(self, meta: dict) -> dict:
        """What any party of the job may see: no secrets, no identifiers."""
        return {k: meta[k] for k in ("job", "primary", "secondaries", "state", "params", "progress", "error",
                                     "seconds", "duplicates")} | {
            "uploads": {p: {"rows": u["rows"], "kind": u["kind"]} for p, u in meta["uploads"].items()},
            "stats": meta.get("stats")}

    # ------------------------------------------------------------------ uploads
    def upload(self, job: str, party: str, data: bytes, *, train_rows: bool = False) -> dict:
        arr = parse_npy(data)
        with self._lock:
            meta = self.meta(job)
            if meta["state"] not in ("created", "failed"):
                raise JobError(409, f"job {job} is {meta['state']}: uploads are closed once it starts")
            if train_rows:
                return self._upload_train_rows(meta, party, arr)
            summary = validate(arr, max_rows=self.max_rows)
            if meta["duplicates"] == "refuse" and summary.duplicates:
                raise UploadError(f"{summary.duplicates} duplicate identifier(s), and this job refuses duplicates")
            write_atomic(self._dir(job) / "uploads" / f"{party}.npy", data)
            meta["uploads"][party] = summary.as_dict()
            self._save(meta)
            return summary.as_dict()

    def _upload_train_rows(self, meta: dict, party: str, arr: np.ndarray) -> dict:
        if party != meta["primary"]:
            raise JobError(403, "only the primary party sends training rows")
        if arr.ndim != 1 or arr.dtype.kind not in "iu" or len(arr) == 0:
            raise UploadError(f"training rows must be a non-empty 1-D integer array; got {arr.dtype} {arr.shape}")
        write_atomic(self._dir(meta["job"]) / "uploads" / f"{party}.train.npy", to_npy(arr))
        meta["train_rows"] = int(len(arr))
        self._save(meta)
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
            return self._update(job, state="queued", params=params.__dict__, error=None,
                                progress={"done": 0, "total": 0})

    def pending(self) -> list[str]:
        """Jobs queued or interrupted while running, oldest first (resumed after a restart)."""
        metas = [json.loads(p.read_text()) for p in self.root.glob("*/job.json")]
        return [m["job"] for m in sorted(metas, key=lambda m: m["created"]) if m["state"] in ("queued", "running")]

    def run(self, job: str) -> None:
        """Compute a queued job: resumable chunked search per secondary, then noise and tokens."""
        meta = self._update(job, state="running")
        params, folder = JobParams(**meta["params"]), self._dir(job)
        try:
            t0 = time.perf_counter()
            query = np.load(folder / "uploads" / f"{meta['primary']}.npy", allow_pickle=False)
            train_path = folder / "uploads" / f"{meta['primary']}.train.npy"
            train_rows = np.load(train_path) if train_path.exists() else None
            if train_rows is not None and (train_rows.min() < 0 or train_rows.max() >= len(query)):
                raise LinkageError(f"training rows must lie in [0, {len(query)}) for the primary's {len(query)} rows")
            chunks = [(lo, min(lo + self.chunk_rows, len(query))) for lo in range(0, len(query), self.chunk_rows)]
            total = len(chunks) * len(meta["secondaries"])
            done = 0
            neighbours, sizes = {}, {}
            anchor = params.anchor or min(meta["secondaries"])
            if params.layout == "chain" and anchor not in meta["secondaries"]:
                raise LinkageError(f"chain anchor {anchor!r} is not one of the secondaries {meta['secondaries']}")
            searched = [anchor] if params.layout == "chain" else meta["secondaries"]
            total = len(chunks) * len(searched)
            for party in searched:
                base = np.load(folder / "uploads" / f"{party}.npy", allow_pickle=False)
                check_identifiers(query[:1], base, params.k, party, params.metric)
                pool = min(max(params.pool, params.k), len(base))
                parts = []
                for lo, hi in chunks:
                    path = folder / "work" / party / f"{lo}-{hi}.npz"
                    if not path.exists():
                        dist, idx = search(query[lo:hi], base, metric=params.metric, k=pool, party=party)
                        write_atomic(path, npz_bytes(dist=dist, idx=idx))
                    with np.load(path) as z:
                        parts.append((z["dist"], z["idx"]))
                    done += 1
                    self._update(job, progress={"done": done, "total": total})
                neighbours[party] = (np.concatenate([d for d, _ in parts]), np.concatenate([i for _, i in parts]))
                sizes[party] = len(base)
            t1 = time.perf_counter()
            result = release(neighbours, sizes, k=params.k, tau=params.tau, seed=params.seed, train_rows=train_rows,
                             job_id=job, metric=params.metric)
            if params.layout == "chain":
                ids = {p: np.load(folder / "uploads" / f"{p}.npy", allow_pickle=False) for p in meta["secondaries"]}
                result = chain_to(result, anchor, ids.pop(anchor), ids, params.metric)
            write_atomic(folder / "results" / "primary.npz", primary_bytes(result.primary))
            for party, s in result.secondaries.items():
                write_atomic(folder / "results" / f"secondary-{party}.npz", secondary_bytes(s))
            stats = {p: {"sigma": l.sigma, "sim_mean": l.sim_mean, "sim_std": l.sim_std, "dp_sigma_eps1": l.dp_sigma}
                     for p, l in result.primary.links.items()}
            self._update(job, state="done", stats=stats,
                         seconds={"search": t1 - t0, "release": time.perf_counter() - t1})
        except (LinkageError, UploadError, JobError) as e:
            self._update(job, state="failed", error=str(e))
        except Exception as e:  # keep the service alive; report the failure to the parties
            self._update(job, state="failed", error=f"internal error: {type(e).__name__}: {e}")
            traceback.print_exc()

    def result_path(self, job: str, party: str) -> Path:
        meta = self.meta(job)
        if meta["state"] != "done":
            raise JobError(409, f"job {job} is {meta['state']}: no result yet"
                                + (f" ({meta['error']})" if meta.get("error") else ""))
        name = "primary.npz" if party == meta["primary"] else f"secondary-{party}.npz"
        return self._dir(job) / "results" / name


class Worker:
    """One background thread computing queued jobs in order (the service's only compute)."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="linkage-worker", daemon=True)

    def start(self) -> None:
        for job in self.store.pending():
            self._queue.put(job)
        self._thread.start()

    def submit(self, job: str) -> None:
        self._queue.put(job)

    def stop(self) -> None:
        self._queue.put(None)

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            self.store.run(job)
