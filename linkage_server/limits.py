"""The operator's limits on what one party can make the shared service hold.

    Limits(max_k, max_cells, chunk_cells, max_uploads_per_party, small_cells)
    job_cells(meta, params)       primary records x candidates (max(K, pool)) x secondaries: a job's size
    Limits.check_job(meta, params)  422 naming the limit, at start, before the job is queued
    Limits.chunk_rows(rows, pool)   the search chunk's rows, so that rows x pool <= chunk_cells
    BodySlots(limit)              concurrent request bodies (uploads, queries) per party: 429 over it

A cell is one (record, candidate) pair; a job's candidates per record are max(K, pool) (the pool
defaults to 4 K under noise, linkage.release.default_pool). A job's chunk of the search holds its distances and rows
(16 bytes a cell) and the release a chunk's tokens and similarities (12 bytes a cell), so the
chunk's cells bound a job's memory whatever its size; the job's cells bound its disk (about 28
bytes a cell: the search's chunks and the release) and its time. Defaults: K at most 1,000 (the
pool 4,000); 500M cells per job (docs/reference.md's 10M x 1M top-50 case: about 14 GB of disk);
chunks of at most 4M cells (64 MB of search results: at K = 100, the 20,000-row default chunk is
2M cells and unchanged; at K = 1,000 a chunk is 4,000 rows); 2 concurrent bodies per party (each
streamed to disk, then validated memory-mapped). Jobs of at most 10M cells run in a lane of their
own (linkage_server.scheduler), so a small job never waits behind a large one.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

from linkage_server.params import JobError, JobParams

POOL_PER_K = 4  # the candidate pool may be this many times max_k (the default pool under noise is 4 K)
QUERY_MAX_CELLS = 10_000_000  # records x max(K, pool) x secondaries per query (linkage_server.queries)


@dataclass(frozen=True)
class QueryLimits:
    budget: int = 1_000_000  # cells (records x K x secondaries) per job, over all its queries; 0 = no queries
    max_records: int = 100_000  # records per query
    max_cells: int = QUERY_MAX_CELLS  # records x max(K, pool) x secondaries per query (serve --query-max-cells)

    def __post_init__(self) -> None:
        if self.budget < 0 or self.max_records < 1:
            raise ValueError(
                f"the query budget must be >= 0 and the records per query >= 1; got {self.budget}, {self.max_records}"
            )


@dataclass(frozen=True)
class Limits:
    max_k: int = 1000  # K per job (the candidate pool: at most POOL_PER_K times this)
    max_cells: int = 500_000_000  # primary records x candidates (max(K, pool)) x secondaries, per job
    chunk_cells: int = 4_000_000  # rows x pool of one search chunk (bounds a job's memory)
    max_uploads_per_party: int = 2  # concurrent request bodies (uploads and queries) per party
    small_cells: int = 10_000_000  # jobs up to this size run in the small lane (scheduler)

    def __post_init__(self) -> None:
        if min(self.max_k, self.max_cells, self.chunk_cells, self.max_uploads_per_party) < 1 or self.small_cells < 0:
            raise ValueError(f"service limits must be >= 1 (small_cells >= 0); got {self}")

    def check_job(self, meta: dict, params: JobParams) -> None:
        """Refuse a job over the operator's limits, naming the limit and the option that sets it."""
        if params.k > self.max_k:
            raise JobError(
                422,
                f"k={params.k} exceeds the service's limit of {self.max_k} neighbours per record "
                "(the operator's serve --max-k)",
            )
        if params.pool > POOL_PER_K * self.max_k:
            raise JobError(
                422,
                f"pool={params.pool} exceeds the service's limit of {POOL_PER_K * self.max_k} "
                f"candidates per record ({POOL_PER_K} x the operator's serve --max-k)",
            )
        cells = job_cells(meta, params)
        if cells > self.max_cells:
            raise JobError(
                422,
                f"the job is {cells:,} cells (primary records x candidates x secondaries), more than the "
                f"service's limit of {self.max_cells:,} (the operator's serve --max-cells): "
                "use a smaller K or split the primary's records into several jobs",
            )

    def chunk_rows(self, rows: int, pool: int) -> int:
        """The search chunk's primary rows: at most ``rows``, and rows x pool <= chunk_cells."""
        return max(1, min(rows, self.chunk_cells // max(pool, 1)))


def job_cells(meta: dict, params: JobParams) -> int:
    """A job's size in cells: primary records x candidates per record (max(K, pool): what the search
    holds) x secondaries (every secondary is released)."""
    records = meta["uploads"][meta["primary"]]["rows"]
    return int(records) * max(params.k, params.pool) * len(meta["secondaries"])


REFERENCE_CHARS = 20  # a string record of this many characters costs what a coordinate cell costs (a title)


def cell_cost(meta: dict) -> float:
    """What one cell of the job costs, in coordinate cells: 1 for numbers and bits; for strings the
    pair of mean record lengths over REFERENCE_CHARS squared (an edit distance is quadratic in them;
    q-gram scorers cost less, so this is an upper bound), at least 1."""
    uploads = meta["uploads"]
    primary = uploads.get(meta["primary"], {}).get("chars", 0.0)
    widest = max((uploads[p].get("chars", 0.0) for p in meta["secondaries"] if p in uploads), default=0.0)
    if not (primary or widest):  # numbers and bits (every party's kind is the metric's: JobStore.start)
        return 1.0
    return max(1.0, (primary or REFERENCE_CHARS) * (widest or REFERENCE_CHARS) / REFERENCE_CHARS**2)


STRING_PAIRS_PER_CELL = 4  # string comparisons of REFERENCE_CHARS records that cost one coordinate cell (estimate)


def job_cost(meta: dict, params: JobParams) -> float:
    """A job's cost in coordinate cells: :func:`job_cells` x :func:`cell_cost`, and for string
    identifiers at least every pair the exact search compares (primary records x each secondary's,
    at :data:`STRING_PAIRS_PER_CELL` pairs a cell): the scheduler's lane goes by it, so a job of
    few cells but long strings or a large secondary is not a "small" job."""
    cost = job_cells(meta, params) * cell_cost(meta)
    uploads = meta["uploads"]
    if uploads.get(meta["primary"], {}).get("kind") == "strings":
        pairs = uploads[meta["primary"]]["rows"] * sum(uploads[p]["rows"] for p in meta["secondaries"] if p in uploads)
        cost = max(cost, pairs * cell_cost(meta) / STRING_PAIRS_PER_CELL)
    return cost


class BodySlots:
    """At most ``limit`` request bodies per party in flight at once (uploads and queries alike):
    ``with slots.hold(job, party): ...``; one more is refused 429 before its body is read."""

    def __init__(self, limit: int) -> None:
        self.limit, self._held, self._lock = limit, {}, threading.Lock()

    @contextmanager
    def hold(self, job: str, party: str):
        key = (job, party)
        with self._lock:
            if self._held.get(key, 0) >= self.limit:
                raise JobError(
                    429,
                    f"party {party!r} already has {self.limit} uploads or queries in progress, "
                    "the service's limit (the operator's serve --max-uploads-per-party): retry "
                    "when one has finished",
                )
            self._held[key] = self._held.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._held[key] -= 1
                if not self._held[key]:
                    del self._held[key]
