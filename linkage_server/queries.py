"""Queries of new primary records against a finished job (predict): ``POST /jobs/{job}/query``.

The primary sends the new records' identifiers (one .npy array, as its training upload: same
kind, same width, Bloom filters of the same length, key and parameters); the service answers
in the job's own regime (linkage.query.query): the secondaries' stored identifiers searched
with the job's candidate pool, similarities standardised with the job's *released* statistics,
noise of the job's sigma keyed by the job's secret and each record, and the job's own tokens,
which each secondary resolves with the token -> row map it already holds. The answer is a
primary.npz of the q new records (linkage.store.primary_bytes): tokens, noisy similarities and
the job's statistics, as a training release holds, never rows or raw distances.

Each job has a query budget in cells, records x K x secondaries (the answer's noisy similarities:
what a query can reveal, bench/query_bisection.py), over all accepted queries (``serve
--query-budget``), each query a cap (``serve --query-max-records``), and each secondary record an
allowance its floor sets (linkage.protection ``draws``: the similarities queries may draw
against it, in multiples of its links in the release; counted in query-draws/<party>.npy); the records used are kept in job.json
("queried"), so a restart does not reset them. A reservation is taken under the store's lock
before the search and given back if the query is refused before its search or the search
fails: two concurrent queries cannot both spend the last of a budget. A query refused by an
allowance (known only on its answer, after the search) keeps its cells spent, so a primary's
refused searches end at its job's budget.

Encoding check: the party's client sends ``X-Encoding-Fingerprint`` (HMAC-SHA256 under the
parties' key of a label and the encoding parameters, linkage.encode.key_fingerprint, bound to
the job by the client) with its training upload and with each query. A query of encoded
identifiers ("bits") whose fingerprint differs from the training upload's, or where either is
missing, is refused by name: the service never sees the key, so it can only compare the two.
"""

from __future__ import annotations

import dataclasses
import hmac
import re
from pathlib import Path

import numpy as np

from files.atomic import write_atomic
from files.private import private_dir
from linkage.binding import identifier_digest
from linkage.contracts import LinkageError
from linkage.job_secret import SecretError, read_secret
from linkage.protection import defences_from
from linkage.query import QueryJob, query
from linkage.store import primary_bytes, read_primary, read_secondary
from linkage_server.job_run import JobRunner
from linkage_server.jobs import SECRET, TRAIN_ROWS
from linkage_server.limits import QueryLimits
from linkage_server.link_counts import links_per_row
from linkage_server.params import FINGERPRINT_HEADER, JobError, JobParams
from linkage_server.uploads import UploadError, kind_of, parse_npy, to_npy, validate

FINGERPRINT = re.compile(r"[0-9a-f]{64}")
DIFFERENT_KEY = "encoded with a different key or parameters than the job's training upload"


def fingerprint_of(value: str | None) -> str | None:
    """The header's fingerprint (None when absent), refused unless it is 64 lowercase hex digits."""
    if not value:
        return None
    if not FINGERPRINT.fullmatch(value):
        raise JobError(422, f"the {FINGERPRINT_HEADER} header must be 64 lowercase hex digits (an HMAC-SHA256)")
    return value


class OverAllowance(JobError):
    """A query whose answer would take a secondary record past its floor's allowance: known only
    after the search, so its cells stay spent (a refusal that cost the service a search is
    charged to the job's budget, which bounds how many such searches a primary can ask for)."""


class Queries:
    """The job store's query half (split from jobs.py for size): it uses the store's lock,
    folders and secret derivation."""

    def __init__(self, store, limits: QueryLimits) -> None:
        self.store, self.limits = store, limits

    def answer(self, job: str, data: bytes, fingerprint: str | None) -> tuple[bytes, dict]:
        """(primary.npz bytes of the new records, the job's budget after this query)."""
        meta = self._queryable(job)
        new = self._parse(meta, data)  # from its header: records, cells, kind, width (no value read yet)
        self._check_encoding(meta, kind_of(new), fingerprint)
        per_record = meta["params"]["k"] * len(meta["secondaries"])  # similarities a record's answer returns
        budget = self._spend(job, len(new), per_record)  # before any value is read: a query past it is not searched
        try:
            validate(new, max_rows=self.limits.max_records)  # NaN/inf, empty strings, by name, block by block
            return self._compute(job, meta, new), budget
        except OverAllowance:
            raise  # refused on its answer, after its search: its cells stay spent (repeats end at the budget)
        except BaseException:
            self._spend(job, -len(new), per_record)  # refused before its search, or the service failed: not counted
            raise

    def _queryable(self, job: str) -> dict:
        meta = self.store.meta(job)
        if meta["state"] != "done":
            raise JobError(409, f"job {job} is {meta['state']}: only a finished (done) job answers queries")
        if self.limits.budget <= 0:
            raise JobError(429, "this service answers no queries (its query budget is 0: serve --query-budget)")
        return meta

    def _parse(self, meta: dict, data: bytes) -> np.ndarray:
        """The query's identifiers, checked against the primary's training upload: kind, width, values."""
        arr = parse_npy(data)
        cap = self.limits.max_records
        if arr.ndim and len(arr) > cap:  # a 0-d array is refused by validate below
            raise JobError(
                429,
                f"a query of {len(arr)} records exceeds the service's cap of {cap} records per "
                f"query (serve --query-max-records); job {meta['job']} has {self._left(meta)} of "
                f"its query budget of {self.limits.budget} cells (records x K x secondaries) left",
            )
        self._check_cells(meta, arr)
        if arr.ndim not in (1, 2) or not len(arr):
            raise UploadError(f"a query must be a non-empty 1-D or 2-D array of identifiers; got shape {arr.shape}")
        trained, kind = meta["uploads"][meta["primary"]], kind_of(arr)
        if kind != trained["kind"]:
            raise UploadError(
                f"the query holds {kind} identifiers ({arr.dtype}); the job's training upload holds "
                f"{trained['kind']} ({trained['dtype']})"
            )
        width, trained_width = (arr.shape[1] if arr.ndim == 2 else 1), (trained["shape"] + [1])[1]
        if width != trained_width:
            unit, scale = {"bits": ("Bloom filter bits", 8), "strings": ("string columns", 1)}.get(
                kind, ("identifier dimensions", 1)
            )
            raise UploadError(
                f"width differs: the query has {width * scale} {unit}, the job's training "
                f"upload has {trained_width * scale}"
            )
        return arr

    def _check_cells(self, meta: dict, arr: np.ndarray) -> None:
        """A query's size in cells (records x candidates (max(K, pool)) x secondaries: what its search holds),
        refused 413 over the operator's cap, before any search."""
        params = meta["params"]
        cells = (len(arr) if arr.ndim else 1) * max(params["k"], params["pool"]) * len(meta["secondaries"])
        if cells > self.limits.max_cells:
            raise JobError(
                413,
                f"a query of {len(arr)} records is {cells:,} cells (records x candidates x secondaries), more "
                f"than the service's cap of {self.limits.max_cells:,} per query (serve "
                "--query-max-cells): send fewer records per query",
            )

    @staticmethod
    def _check_encoding(meta: dict, kind: str, fingerprint: str | None) -> None:
        """Encoded identifiers must come from the training upload's key and parameters."""
        if kind != "bits":
            return  # raw identifiers: nothing to compare
        trained = meta["uploads"][meta["primary"]].get("fingerprint")
        if not trained:
            raise JobError(
                422,
                f"job {meta['job']}'s training upload carries no encoding fingerprint, so a query "
                "of encoded (Bloom) identifiers cannot be checked against it: upload the training "
                "identifiers with a client that sends the key's fingerprint, and link again",
            )
        if not fingerprint:
            raise JobError(
                422,
                f"the query of encoded (Bloom) identifiers carries no encoding fingerprint "
                f"({FINGERPRINT_HEADER}), so it cannot be checked against the job's training upload",
            )
        if not hmac.compare_digest(fingerprint, trained):
            raise JobError(422, f"the query's identifiers were {DIFFERENT_KEY}")

    @staticmethod
    def _used(meta: dict) -> dict:
        """The job's queries so far: records, queries and cells (records x K; a job from before
        cells were counted: its records x K)."""
        used = {"records": 0, "queries": 0, **meta.get("queried", {})}
        return {**used, "cells": used.get("cells", used["records"] * meta["params"]["k"])}

    def _left(self, meta: dict) -> int:
        return max(self.limits.budget - self._used(meta)["cells"], 0)

    def _spend(self, job: str, records: int, per_record: int) -> dict:
        """Reserve `records` x K x secondaries cells of the job's budget (negative: give them back),
        persisted in job.json: every similarity returned counts, one per secondary."""
        with self.store.lock:
            meta = self.store.meta(job)
            used, left, cells = self._used(meta), self._left(meta), records * per_record
            if cells > left:
                raise JobError(
                    429,
                    f"a query of {records} records ({cells} cells, records x K x secondaries) exceeds job {job}'s "
                    f"query budget: {used['cells']} of {self.limits.budget} cells used, {left} left "
                    "(the operator's serve --query-budget)",
                )
            step = 1 if records > 0 else -1
            meta["queried"] = {
                "records": used["records"] + records,
                "queries": used["queries"] + step,
                "cells": used["cells"] + cells,
            }
            self.store.save(meta)
        return {"budget": self.limits.budget, "used": meta["queried"]["cells"], "left": left - cells}

    def _compute(self, job: str, meta: dict, new: np.ndarray) -> bytes:
        """linkage.query.query with the job's stored secret, uploads, released statistics and maps."""
        folder = self.store.folder(job)
        params = JobParams(**meta["params"])
        trained = read_primary(folder / "results" / "primary.npz", rows=False)  # figures only: bounded memory
        base = {p: np.load(folder / "uploads" / f"{p}.npy", allow_pickle=False) for p in meta["secondaries"]}
        maps = {
            p: read_secondary(folder / "results" / f"secondary-{p}.npz", p).row_of_token for p in meta["secondaries"]
        }
        counts = {p: links_per_row(folder, p, maps[p]) for p, link in trained.links.items() if link.composed}
        try:  # composed noise counts the release's links per row: counted once per job (link_counts)
            got = query(
                new,
                QueryJob(
                    base,
                    trained,
                    maps,
                    pool=meta["params"]["pool"] or params.k,  # a job stored with pool 0 searched K
                    links_per_row=counts,
                    anchor=params.spec().anchor_of(meta["secondaries"]),
                ),
                secret=self._secret(folder, meta, params, base),
            )
        except LinkageError as e:
            raise UploadError(str(e)) from None
        answer = primary_bytes(dataclasses.replace(got, ids_sha256=identifier_digest(new)))
        self._draw(job, meta, got, maps, counts)  # each secondary's per-record allowance, or refused: counted last
        return answer

    def _draw(self, job: str, meta: dict, got, maps: dict, counted: dict) -> None:
        """Count the answer's similarities against each secondary record; refuse (429, naming the
        secondary) an answer that takes any record past its floor's allowance: ``draws`` x the
        record's links in the release (at least 1), kept in ``query-draws/<party>.npy`` (0600);
        ``counted``: the links per row the query already read (composed parties)."""
        folder, floors = self.store.folder(job), self.store.floors.of(meta)
        bounded = {p: floors[p].draws for p in got.links if floors[p].draws != float("inf")}
        links = {  # links per row: ``counted`` (a composed job's, read for the query) or read now, outside the lock
            p: counted[p] if p in counted else links_per_row(folder, p, maps[p]) for p in bounded
        }
        with self.store.lock:
            totals = {}
            for party, allowance in sorted(bounded.items()):
                n = len(maps[party])
                drawn = np.bincount(np.asarray(maps[party])[got.links[party].tokens.ravel()], minlength=n)  # (n,)
                path = folder / "query-draws" / f"{party}.npy"
                totals[party] = (np.load(path) if path.exists() else np.zeros(n, np.int64)) + drawn
                cap = np.maximum(allowance * np.maximum(links[party], 1), 1)  # (n,) at least one draw a record
                over = int((totals[party] > cap).sum())
                if over:
                    raise OverAllowance(
                        429,
                        f"secondary {party!r}'s privacy floor allows queries to draw at most {allowance:g} x "
                        f"each of its records' links in the release; this query would take {over} of its "
                        "records past that (the averaging attack's budget: docs/privacy.md); query fewer "
                        "or other records. It was searched before it was refused: its cells count against "
                        "the job's query budget",
                    )
            for party, total in totals.items():
                write_atomic(private_dir(folder / "query-draws") / f"{party}.npy", to_npy(total))

    def _secret(self, folder: Path, meta: dict, params: JobParams, ids: dict) -> bytes:
        """The job's secret as its release used it (under an operator seed: from the job's content,
        ``ids`` the secondaries' uploads, and the defences it recorded)."""
        try:
            if self.store.operator_seed is None:
                return read_secret(folder / SECRET)
            primary = np.load(folder / "uploads" / f"{meta['primary']}.npy", allow_pickle=False)
            rows = np.load(folder / TRAIN_ROWS) if meta.get("train_rows") else None
            spec = params.spec(defences_from(meta.get("defences"), params.radius, params.compose))
            return JobRunner(self.store).secret(meta, spec, primary, ids, rows)
        except SecretError as e:
            raise JobError(500, f"{e}; no query is answered under another secret") from None
