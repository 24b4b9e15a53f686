"""A job's parameters as a party sends them (``POST /jobs/{job}/start``), strictly checked, the
error a job request is refused with, and the header an encoded upload's key fingerprint travels in."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass, fields

from linkage.approx import METHODS as METHODS_SEARCH
from linkage.approx import Approx
from linkage.contracts import METRICS, Defences
from linkage.job import JobSpec
from linkage.metrics import metric as metric_named
from linkage.release import default_pool

FINGERPRINT_HEADER = "X-Encoding-Fingerprint"  # an encoded upload's key fingerprint (linkage_server.queries)


class JobError(Exception):
    """A request the job cannot honour. status: the HTTP status the service answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class JobParams:
    metric: str
    k: int
    tau: float = 0.0  # the attack bound the primary asks for; 0 = none asked (the secondaries' floors decide)
    pool: int = 0  # candidates per record before noise; 0 = the default (linkage.release.default_pool), resolved
    layout: str = "independent"  # or "chain": paper App. C, secondaries linked one-to-one to `anchor`
    anchor: str = ""  # the chain's anchor secondary; "" = the first by name
    radius: float = 0.0  # Theorem 2's success radius, identifier units; 0 = half each secondary's spacing
    compose: bool = False  # noise on a link scaled by sqrt(its secondary record's links) (Defences)
    search: str = "exact"  # or an approximate index: "hnsw" / "ivf", or "auto" by size (linkage.approx)
    recall_floor: float = 0.0  # an approximate search under this tie-aware recall fails the job
    width: int = 0  # the approximate search's width: IVF's nprobe, HNSW's ef_search, qgram's candidates; 0 = default

    @property
    def bound(self) -> float:
        """Theorem 2's tau the noise is calibrated to: the primary's, else 1 (the floors' noise only)."""
        return self.tau or 1.0

    def with_pool(self, noisy: bool) -> "JobParams":
        """pool = 0 made the job's default pool (K without noise, 4 K under noise: ``noisy`` when
        the primary's tau or a secondary's floor asks for it), so that the search, the release, a
        query and the status all name the pool the job really used (linkage_server.jobs.start)."""
        if self.pool:
            return self
        return dataclasses.replace(self, pool=default_pool(0, self.k, self.bound, noisy))

    def spec(self, defences: Defences | None = None) -> JobSpec:
        """The job as the linkage library names it (linkage.job): what decides its content id,
        shared with the in-process linker; always a top-K job (the service runs no baseline).
        ``defences``: the job's, resolved from the floors (linkage.protection.resolve)."""
        return JobSpec(
            self.metric,
            self.k,
            self.bound,
            layout=self.layout,
            anchor=self.anchor,
            pool=self.pool,
            defences=defences or Defences(radius=self.radius or 0.5, compose=self.compose),
            approx=self.approx(),
        )

    def approx(self) -> Approx:
        widths = {"nprobe": self.width, "ef_search": self.width, "candidates": self.width} if self.width else {}
        return Approx(method=self.search, recall_floor=self.recall_floor, **widths)  # each method reads its own

    @classmethod
    def parse(cls, body: dict) -> "JobParams":
        """The parameters a party sent, each of exactly its field's type (a missing one takes the
        field's default; metric and k have none), then checked together (:func:`_check`)."""
        kinds = {f.name: (_KIND[f.type], None if f.default is MISSING else f.default) for f in fields(cls)}
        unknown = sorted(set(body) - set(kinds))  # no seed: the service's secret draws
        if unknown:
            raise JobError(422, f"unknown job parameter(s) {unknown}; known: {sorted(kinds)}")
        return _check(cls(**{name: _field(body, name, kind, default) for name, (kind, default) in kinds.items()}))


_KIND = {"str": str, "int": int, "float": float, "bool": bool}  # JobParams' annotations (strings: __future__)


def _check(p: JobParams) -> JobParams:
    """``p`` if its values make a job together, else 422 naming the first that does not."""
    if p.metric not in METRICS:
        raise JobError(422, f"unknown metric {p.metric!r}; known: {list(METRICS)}")
    if p.k < 1:
        raise JobError(422, f"k must be >= 1, got {p.k}")
    if p.layout not in ("independent", "chain"):
        raise JobError(422, f"layout must be 'independent' or 'chain', got {p.layout!r}")
    if not 0.0 <= p.tau <= 1.0:
        raise JobError(422, f"tau must be in (0, 1] (0: none asked, the secondaries' floors decide), got {p.tau}")
    if p.pool and p.pool < p.k:
        raise JobError(422, f"pool ({p.pool}) must be 0 or >= k ({p.k})")
    if p.radius < 0:
        raise JobError(422, f"radius must be >= 0 (0: half each secondary's spacing), got {p.radius}")
    if p.search not in METHODS_SEARCH or p.search not in ("exact", "auto", *metric_named(p.metric).approx):
        raise JobError(
            422,
            f"search {p.search!r} is not one of {list(METHODS_SEARCH)} for metric {p.metric!r} "
            "(hnsw, ivf: euclidean and hamming; qgram: string metrics)",
        )
    if p.search != "exact" and p.layout == "chain":  # "auto" too: it could pick an index at scale
        raise JobError(422, f"search {p.search!r} is for independently linked secondaries; a chain searches exactly")
    if not 0 <= p.width <= WIDTH_MAX:
        raise JobError(
            422,
            f"width must be 0 (the search's default) to {WIDTH_MAX}, got {p.width}: it sizes "
            "the search's working memory",
        )
    if not 0.0 <= p.recall_floor <= 1.0:
        raise JobError(422, f"recall_floor must be in [0, 1], got {p.recall_floor}")
    return p


INT_MAX = 2**31 - 1  # the largest k or pool a job accepts
WIDTH_MAX = 1024  # the widest approximate search: HNSW's beam, IVF's cells probed, q-gram candidates per record


def _field(body: dict, name: str, kind: type, default=None):
    """body[name] if it has exactly the type `kind` (an int is a float; bool is neither), else 422."""
    if name not in body:
        if default is None:
            raise JobError(422, f"missing job parameter {name!r}")
        return default
    value = body[name]
    ok = (
        isinstance(value, bool)
        if kind is bool
        else (isinstance(value, (int, float) if kind is float else kind) and not isinstance(value, bool))
    )
    if not ok:
        raise JobError(
            422,
            f"job parameter {name!r} must be {'a number' if kind is float else kind.__name__}, "
            f"got {value!r} ({type(value).__name__})",
        )
    if kind is int and not -INT_MAX <= value <= INT_MAX:
        raise JobError(422, f"job parameter {name!r} = {value} is out of range (at most {INT_MAX})")
    if kind is float:
        try:
            value = float(value)
        except OverflowError:
            value = float("inf")
        if value != value or abs(value) == float("inf"):
            raise JobError(422, f"job parameter {name!r} must be a finite number, got {body[name]!r}")
    return value
