"""What a linkage job is, in one place: :class:`JobSpec`, its content id and how it is run.

The in-process linker (app/vfl/parties.py) and the linkage service (linkage_server/jobs.py) both
build a JobSpec, so that the same inputs give the same content id (and so, under an operator
seed, the same secret and the same release: linkage.job_secret.operator_secret).

    JobSpec(metric, k, tau, kind, layout, anchor, pool, defences, approx)
    spec.content_id(primary (m, ..), {party: (n_p, ..)}, train_rows) -> str, 16 hex digits
    spec.run(primary, {party: ids}, secret=, train_rows=, job_id=) -> LinkageResult

kind: "topk" (K nearest per secondary, or along a chain), "exact" (the Exact baseline: the
neighbour at distance 0, if any) or "known" (the Combine baseline: each record's true row, known
for synthetic sets only; named by its caller, as no identifiers enter it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from linkage.approx import Approx
from linkage.contracts import METRICS, Defences, LinkageError, LinkageResult

KINDS = ("topk", "exact", "known")
LAYOUTS = ("independent", "chain")


@dataclass(frozen=True)
class JobSpec:
    metric: str
    k: int
    tau: float = 1.0
    kind: str = "topk"
    layout: str = "independent"  # or "chain": paper App. C, the secondaries linked one-to-one to the anchor
    anchor: str = ""  # the chain's anchor secondary; "" = the first by name
    pool: int = 0  # candidates per record before noise; 0 = linkage.release.default_pool
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
        """The job's content hash (linkage.pipeline.job_id_of): the same inputs and spec, the same id."""
        from linkage.pipeline import chain_tag, job_id_of  # lazy: scipy, only when a job is named or run

        if self.kind == "known":
            raise LinkageError("a known-alignment job links no identifiers: its caller names it")
        if self.kind == "exact":
            return job_id_of(primary, secondaries, 1, 1.0, f"{self.metric}-exact", 0, train_rows)
        metric = chain_tag(self.metric, self.anchor_of(secondaries)) if self.chain else self.metric
        return job_id_of(
            primary, secondaries, self.k, self.tau, metric, self.pool, train_rows, self.defences, self.approx
        )

    def run(
        self,
        primary,
        secondaries: dict,
        *,
        secret: bytes,
        train_rows: np.ndarray | None = None,
        job_id: str | None = None,
        sizes: dict[str, int] | None = None,
    ) -> LinkageResult:
        """Link by the spec's kind and layout. job_id: None = :meth:`content_id`. A "known" job
        takes each secondary's true row per primary record as ``secondaries``, the parties' row
        counts as ``sizes`` and its caller's ``job_id`` (``primary`` unused)."""
        from linkage.pipeline import link, link_chain, link_exact, link_known  # lazy: scipy, when a job runs

        if self.kind == "known":
            if job_id is None or sizes is None:
                raise LinkageError("a known-alignment job needs its job_id and the parties' sizes")
            return link_known(secondaries, sizes, secret=secret, job_id=job_id)
        job = job_id or self.content_id(primary, secondaries, train_rows)
        if self.kind == "exact":
            return link_exact(
                primary, secondaries, secret=secret, train_rows=train_rows, metric=self.metric, job_id=job
            )
        if self.chain:
            return link_chain(
                primary,
                secondaries,
                anchor=self.anchor_of(secondaries),
                k=self.k,
                tau=self.tau,
                secret=secret,
                train_rows=train_rows,
                metric=self.metric,
                pool=self.pool,
                job_id=job,
                defences=self.defences,
            )
        return link(
            primary,
            secondaries,
            k=self.k,
            tau=self.tau,
            secret=secret,
            train_rows=train_rows,
            metric=self.metric,
            pool=self.pool,
            job_id=job,
            defences=self.defences,
            approx=self.approx,
        )
