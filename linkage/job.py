"""What a linkage job is, in one place: :class:`JobSpec`, its content id and its default pool
(linkage.runner runs it).

The in-process linker (app/vfl/linking.py) and the linkage service (linkage_server/jobs.py) both
build a JobSpec, so that the same inputs give the same content id (and so, under an operator
seed, the same secret and the same release: linkage.job_secret.operator_secret).

    JobSpec(metric, k, tau, kind, layout, anchor, pool, defences, approx)
    spec.content_id(primary (m, ..), {party: (n_p, ..)}, train_rows) -> str, 16 hex digits
    run_job(spec, primary, {party: ids}, secret=, train_rows=, job_id=) -> LinkageResult (linkage.runner:
        the in-process linker's and, through run_topk, the service's)
    default_pool(pool, k, tau, noisy) -> the candidates per record a job searches

kind: "topk" (K nearest per secondary, or along a chain), "exact" (the Exact baseline: the
neighbour at distance 0, if any) or "known" (the Combine baseline: each record's true row, known
for synthetic sets only; named by its caller, as no identifiers enter it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from linkage.approx import Approx
from linkage.contracts import METRICS, Defences, LinkageError, identifier_bytes

KINDS = ("topk", "exact", "known")
POOL_FACTOR = 4  # the default pool under noise: candidates per record, in multiples of K
LAYOUTS = ("independent", "chain")


@dataclass(frozen=True)
class JobSpec:
    metric: str
    k: int
    tau: float = 1.0
    kind: str = "topk"
    layout: str = "independent"  # or "chain": paper App. C, the secondaries linked one-to-one to the anchor
    anchor: str = ""  # the chain's anchor secondary; "" = the first by name
    pool: int = 0  # candidates per record before noise; 0 = default_pool (below)
    defences: Defences = Defences()
    approx: Approx = Approx()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise LinkageError(f"unknown job kind {self.kind!r}; known: {list(KINDS)}")
        if self.layout not in LAYOUTS:
            raise LinkageError(f"layout must be 'independent' or 'chain', got {self.layout!r}")
        if self.kind != "known" and self.metric not in METRICS:
            raise LinkageError(f"unknown metric {self.metric!r}; known: {list(METRICS)}")
        if self.chain and self.approx.method != "exact":  # "auto" too: it could pick an index at scale
            raise LinkageError(
                f"search {self.approx.method!r} is for independently linked secondaries; a chain searches exactly"
            )

    @property
    def chain(self) -> bool:
        """Linked along a chain: a top-K job of the chain layout (Exact and Combine link each party)."""
        return self.kind == "topk" and self.layout == "chain"

    def anchor_of(self, secondaries) -> str:
        """The chain's anchor among the secondaries' names: the named one, else the first by name."""
        return self.anchor or min(secondaries)

    def searched(self, secondaries) -> list[str]:
        """The secondaries searched top-K from the primary: the anchor of a chain, else every one."""
        return [self.anchor_of(secondaries)] if self.chain else list(secondaries)

    def attacked(self, secondaries) -> list[str] | None:
        """The parties the privacy report attacks: a chain's anchor (whose similarities every
        party shares), else None (every party)."""
        return [self.anchor_of(secondaries)] if self.chain else None

    def content_id(self, primary, secondaries: dict, train_rows: np.ndarray | None = None) -> str:
        """The job's content hash (:func:`job_id_of`): the same inputs and spec, the same id."""
        if self.kind == "known":
            raise LinkageError("a known-alignment job links no identifiers: its caller names it")
        if self.kind == "exact":
            return job_id_of(primary, secondaries, 1, 1.0, f"{self.metric}-exact", 0, train_rows)
        metric = chain_tag(self.metric, self.anchor_of(secondaries)) if self.chain else self.metric
        return job_id_of(
            primary, secondaries, self.k, self.tau, metric, self.pool, train_rows, self.defences, self.approx
        )


def default_pool(pool: int, k: int, tau: float, noisy: bool = False) -> int:
    """Candidates per record before noise: ``pool`` when set (> 0); else K without noise (tau = 1,
    the release of old) and POOL_FACTOR K under noise, so that the K kept are chosen under noise
    (:func:`noisy_choice`) and the released set, not only its similarities, carries it.
    ``noisy``: noise comes from a privacy floor (linkage.protection) whatever tau. Clipped to
    the secondary's size by the caller."""
    if pool:
        return pool
    return k if tau >= 1.0 and not noisy else POOL_FACTOR * k


def job_id_of(
    primary_ids,
    secondary_ids: dict,
    k: int,
    tau: float,
    metric: str = "euclidean",
    pool: int = 0,
    train_rows: np.ndarray | None = None,
    defences: Defences = Defences(),
    approx: Approx = Approx(),
) -> str:
    """A content hash of the job: the same inputs and parameters give the same id."""
    h = hashlib.sha256()
    for arr in map(np.asarray, (primary_ids, *(secondary_ids[p] for p in sorted(secondary_ids)))):
        h.update(f"|{arr.shape}|".encode())  # each party's shape: no two splits of the rows collide
        h.update(identifier_bytes(arr))
    if train_rows is not None:
        h.update(b"|train|" + np.asarray(train_rows, np.int64).tobytes())
    tail = (
        f"|{pool}" if pool and pool != default_pool(0, k, tau, defences.noisy) else ""
    )  # the default pool, named or not: one job
    h.update(f"{sorted(secondary_ids)}|{k}|{tau!r}|{metric}{tail}{defences.tag()}{approx.tag()}".encode())
    return h.hexdigest()[:16]


def chain_tag(metric: str, anchor: str) -> str:
    """A chain job's metric in its content id: one name for the service and the in-process linker."""
    return f"{metric}-chain-{anchor}"
