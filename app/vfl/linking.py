"""A run's linkage, linked here or read from the linkage service: which job, with which secret,
checked against the run's data, and its privacy report.

The simulation, the one-process twin and the benchmarks link through :func:`link_and_report`,
which builds the same :class:`linkage.job.JobSpec` the service does; a deployed run reads the
service's results (``linkage-dir``) and checks them against its data (:func:`check_linkage`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from logging import INFO
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from flwr.common.logger import log
from threadpoolctl import threadpool_limits

from app.config import RunConfig, Settings
from app.config_groups import plain_run_name
from app.node import simulated_linkage_dir
from linkage.binding import bind_result, check_binding, upload_record, write_record
from linkage.contracts import DEFAULT_STRING_METRIC, Defences, LinkageError, LinkageResult, PrimaryLinkage
from linkage.encode import encode_with_key, federal_key
from linkage.job_secret import operator_secret, operator_seed_from_env, secret_for
from linkage.metrics import DEFAULT_OF_KIND
from linkage.metrics import metric as metric_named
from linkage.protection import Floor, chained, record, resolve
from linkage.store import load_primary, load_privacy, save_job, save_privacy
from strategies.vfl.methods import method as registered

if TYPE_CHECKING:
    from datasets.base import VFLDataset


def run_linkage(ds: VFLDataset, cfg: RunConfig, settings: Settings) -> LinkageResult:
    """What the linkage service computes from both parties' identifiers, linked here on its behalf.

    Its randomness comes from the in-process service's own per-job secret (:func:`service_secret`),
    never from the run's seed, which the primary chooses."""
    return link_and_report(ds, cfg, settings, report=False)[0]


def require_linkable(ds: VFLDataset, cfg: RunConfig) -> None:
    """What the linkage would refuse about the data for this run's method (also checked by
    fedsim train before Flower starts): method 'combine' needs every record's true alignment, a
    top-K method K records in every secondary."""
    if cfg.training_method.links == "known" and (
        not ds.true_match or any((r < 0).any() for r in ds.true_match.values())
    ):
        raise ValueError(
            f"method 'combine' needs the true alignment of every record, which dataset "
            f"{ds.name!r} does not have (synthetic sets only)"
        )
    if job_kind(cfg.train.method) == "topk" and cfg.training_method.federated and cfg.link.linkage_dir:
        folder = Path(cfg.link.linkage_dir).resolve()  # the fetched job: bound to this run and of its shape
        head = load_primary(folder, rows=False)  # its figures; the (m, K) arrays stay on disk
        check_binding(head, folder, ds.primary.identifiers)  # the digest covers the record count
        check_shape(head, ds, cfg.resolve().k, cfg.link.layout)
    elif job_kind(cfg.train.method) == "topk" and cfg.training_method.federated:
        k = cfg.resolve().k
        small = {p: t.n_rows for p, t in ds.secondaries.items() if t.n_rows < k}
        if small:
            p, rows = min(small.items(), key=lambda kv: kv[1])
            raise ValueError(
                f"run-config k = {k} is more than secondary {p!r}'s {rows} rows: each record links to K of "
                f"its records; set -c k=<at most {rows}>"
            )


def link_and_report(
    ds: VFLDataset, cfg: RunConfig, settings: Settings, *, report: bool = True, max_tokens: int = 0
) -> tuple[LinkageResult, dict | None]:
    """:func:`run_linkage`, and the job's privacy report (linkage.privacy) scored with both
    parties' identifiers as the service holds them (None: not asked for, or method 'combine',
    which links by the planted truth and releases no similarity). max_tokens: tokens attacked
    per party (0 = the report's default)."""
    from linkage.job import JobSpec  # the linkage library on first run: not per message
    from linkage.runner import run_job  # scipy (the search) on first run: not per message

    with threadpool_limits(limits=1, user_api="blas"):  # see _load
        if cfg.training_method.links == "known":
            require_linkable(ds, cfg)
            sizes = {p: t.n_rows for p, t in ds.secondaries.items()}
            job = f"true-{ds.name}-{cfg.train.seed}-{cfg.data.n_rows}"
            spec = JobSpec("", 1, kind=job_kind(cfg.train.method))
            return run_job(spec, None, ds.true_match, secret=service_secret(cfg, job), job_id=job, sizes=sizes), None
        metric = metric_of(ds)
        primary, ids = ds.primary.identifiers, {p: t.identifiers for p, t in ds.secondaries.items()}
        if cfg.link.encoding == "bloom":
            primary, ids = encode_parties(primary, ids, metric, cfg.train.seed, settings.k)
            metric = DEFAULT_OF_KIND["bits"]
        train = ds.split.train
        kind = job_kind(cfg.train.method)
        spec = JobSpec(metric, settings.k, cfg.link.tau, kind=kind, layout=cfg.link.layout)
        defences = job_defences(cfg, ids, metric, spec.anchor_of(ids)) if kind == "topk" else spec.defences
        spec = dataclasses.replace(spec, defences=defences)
        job = spec.content_id(primary, ids, train)
        result = run_job(spec, primary, ids, secret=service_secret(cfg, job), train_rows=train, job_id=job)
        if not report:
            return result, None
        from linkage.privacy import (  # lazy: the privacy report (rapidfuzz), off the ClientApp's per-message imports
            MAX_TOKENS,
            safe_report,
        )

        own = spec.attacked(ids)  # chain: the anchor's sims
        report = safe_report(
            result,
            primary,
            ids,
            metric,
            parties=own,
            max_tokens=max_tokens or MAX_TOKENS,
            secret=service_secret(cfg, result.primary.job_id),
        )  # keys the attacked sample
        return result, report | {"protection": protection_of(cfg, ids, spec)}


def job_floors(cfg: RunConfig, ids: dict, anchor: str) -> dict[str, Floor]:
    """Each secondary's privacy floor in a simulation, which plays every party: the run's
    ``privacy`` level for every one (a chain's anchor: the strictest, linkage.protection.chained)."""
    floors = {p: Floor.of_level(cfg.link.privacy) for p in ids}
    return chained(floors, anchor) if cfg.link.layout == "chain" and len(ids) > 1 else floors


def job_defences(cfg: RunConfig, ids: dict, metric: str, anchor: str) -> Defences:
    """The linkage's noise calibration (linkage.contracts.Defences): the floors sized from the
    secondaries' identifiers ``ids`` (linkage.protection.resolve), with the run's radius and compose."""
    link = cfg.link
    return resolve(
        job_floors(cfg, ids, anchor),
        ids,
        metric,
        radius=link.privacy_radius,
        compose=link.privacy_compose,
        tau=link.tau,
    )


def protection_of(cfg: RunConfig, ids: dict, spec) -> dict:
    """What the job's release records of the protection it got (linkage.protection.record)."""
    floors = job_floors(cfg, ids, spec.anchor_of(ids))
    return record({p: cfg.link.privacy for p in floors}, floors, spec.defences)


def job_kind(method: str) -> str:
    """The linkage job a run's method asks for (linkage.job.KINDS), from the method registry
    (strategies/vfl/methods.py): 'exact' links each record to its neighbour at distance 0,
    'known' to its true row, 'topk' to its K most similar records."""
    return registered(method).links or "topk"


def service_secret(cfg: RunConfig, job_id: str, *, create: bool = True) -> bytes:
    """The in-process linkage service's secret for one job: drawn from the OS's CSPRNG the first
    time the job is linked, kept 0600 under ``<out-dir>/linkage-service/`` (apart from the
    parties' results) so that the same job links identically again, and never put in a message.
    The operator may fix it with $FEDSIM_LINKAGE_OPERATOR_SEED; the run config cannot."""
    if not plain_run_name(job_id):
        raise LinkageError(f"linkage job id {job_id!r} is not one plain name")
    seed = operator_seed_from_env()
    if seed is not None:
        return operator_secret(seed, job_id)  # job_id: the job's content id, as the service derives it
    path = cfg.out_path() / "linkage-service" / f"{job_id}.key"
    if not create and not path.exists():  # predict: never a new secret, which would re-draw the noise
        raise LinkageError(
            f"linkage job {job_id}: its secret {path} is missing; the job's noise cannot be reproduced without it"
        )
    return secret_for(path)


def encode_parties(
    primary: np.ndarray, secondaries: dict[str, np.ndarray], metric: str, seed: int, k: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Run config encoding="bloom": what each party does locally before uploading (docs/reference.md
    "The linkage service", private mode): strings -> keyed q-gram Bloom filters, numbers -> FEDERAL
    interval filters; the service then links by Hamming distance (the key: :func:`parties_key`)."""
    key = parties_key(primary, secondaries, metric, k, simulated_secret(seed))
    return encode_with_key(primary, key), {p: encode_with_key(v, key) for p, v in secondaries.items()}


def simulated_secret(seed: int) -> bytes:
    """The parties' shared encoding secret in one simulation process, which plays every party:
    derived from the run's seed (a deployment's parties draw theirs: deploy/private_mode.py)."""
    return hashlib.sha256(f"fedsim-simulated-parties-{seed}".encode()).digest()


def parties_key(
    primary: np.ndarray, secondaries: dict[str, np.ndarray], metric: str, k: int, secret: bytes | str
) -> dict:
    """The parties' shared encoding key under ``secret``, from the training data as every party
    holds it (predict derives the same key from the same data): FEDERAL's bounds are the box
    holding every party's values and its t comes from the first secondary's values
    (encode.federal_key)."""
    key: dict = {"secret": secret}
    if metric_named(metric).kind == "numbers":  # (strings: any of linkage.contracts.STRING_METRICS)
        values = [np.asarray(v, np.float64) for v in (primary, *secondaries.values())]  # each (n_p, d)
        if len(values[1]) <= k:
            raise LinkageError(
                f"encoding='bloom': secondary {next(iter(secondaries))!r} has {len(values[1])} "
                f"records, K = {k} needs more"
            )
        lo = np.min([v.min(axis=0) for v in values], axis=0)  # (d,) the box holding every party's values
        hi = np.max([v.max(axis=0) for v in values], axis=0)
        key["federal"] = federal_key(values[1], k=k, lo=lo, hi=hi)
    return key


def metric_of(ds: VFLDataset) -> str:
    """The dataset's own linkage metric (parties.toml ``metric``), else numbers by Euclidean
    distance and strings by the linkage library's default string metric."""
    if ds.metric:
        return ds.metric
    return DEFAULT_STRING_METRIC if ds.primary.id_kind == "string" else DEFAULT_OF_KIND["numbers"]


def linkage_job(ds: VFLDataset, cfg: RunConfig, settings: Settings) -> tuple[PrimaryLinkage, Path]:
    """The primary's view of the linkage job and the folder the secondaries read theirs from.

    With ``linkage-dir`` set: the files fetched from the linkage service, bound to this run (the
    job the primary uploaded to, linked from this run's primary identifiers: linkage.binding)
    and checked against it. Otherwise the linkage runs here in the ServerApp's process on behalf of
    the service (nothing is uploaded: the digests are of the raw identifiers); only the primary's
    file is read back, and each secondary reads its own token -> row map."""
    if cfg.link.linkage_dir:
        folder = Path(cfg.link.linkage_dir).resolve()
        fetched = load_primary(folder)
        check_binding(fetched, folder, ds.primary.identifiers)
        linkage = check_linkage(fetched, ds, settings, cfg.link.layout)
    else:
        result, report = link_and_report(ds, cfg, settings, report=cfg.link.privacy_report)
        result = bind_result(result, ds.primary.identifiers)
        folder = simulated_linkage_dir(cfg, result.primary.job_id)
        save_job(result, folder)
        save_privacy(report, folder)
        write_record(folder, upload_record(result.primary.job_id, "primary", ds.primary.identifiers))
        linkage = load_primary(folder)
    return (linkage if settings.model.sort_gate else unsorted(linkage, cfg.train.seed)), folder


def job_privacy(folder: Path | None, linkage: PrimaryLinkage | None, tag: str) -> dict | None:
    """The linkage job's privacy report (linkage.privacy: written by the service, or by the
    in-process linker), logged; None for Solo or a job that came without one."""
    from linkage.privacy import report_lines  # lazy: rapidfuzz, off the ClientApp's per-message imports

    if folder is None or linkage is None:
        return None
    report = load_privacy(folder, linkage.job_id)
    for line in report_lines(report) if report else [f"privacy: no report for linkage job {linkage.job_id}"]:
        log(INFO, "%s %s", tag, line)
    return report


def unsorted(linkage: PrimaryLinkage, seed: int) -> PrimaryLinkage:
    """The K neighbours of each record in a seeded random order (the service hands them out
    sorted): without the sort gate the model sees them as the reference's did, unordered."""
    rng = np.random.default_rng([seed, 11])
    links, shared = {}, None
    for p, party_link in sorted(linkage.links.items()):
        order = np.argsort(rng.random(party_link.tokens.shape), axis=1)  # (m, K) a permutation per row
        if linkage.shared_sims:  # a chain's parties keep their k-th neighbours together
            order = shared = order if shared is None else shared
        links[p] = dataclasses.replace(
            party_link,
            tokens=np.take_along_axis(party_link.tokens, order, 1),
            sims=np.take_along_axis(party_link.sims, order, 1),
        )
    return dataclasses.replace(linkage, links=links)


def check_linkage(
    linkage: PrimaryLinkage, ds: VFLDataset, settings: Settings, layout: str = "independent"
) -> PrimaryLinkage:
    """Refuse a fetched linkage that does not fit this run (other K, layout, parties or rows)."""
    check_shape(linkage, ds, settings.k, layout)
    for party_link in linkage.links.values():
        if len(party_link.tokens) != ds.primary.n_rows:
            raise LinkageError(
                f"linkage job {linkage.job_id} covers {len(party_link.tokens)} primary records, "
                f"the primary has {ds.primary.n_rows}"
            )
    return linkage


def check_shape(linkage: PrimaryLinkage, ds: VFLDataset, k: int, layout: str) -> None:
    """Refuse a fetched linkage of another K, layout or parties than this run's."""
    if linkage.k != k:
        raise LinkageError(
            f"linkage job {linkage.job_id} has K={linkage.k} but this run uses k={k}; set run-config k to match"
        )
    if len(linkage.links) > 1 and linkage.layout != layout:
        raise LinkageError(
            f"linkage job {linkage.job_id} is a {linkage.layout!r} linkage of {len(linkage.links)} "
            f"parties but this run uses layout={layout!r}; set run-config layout to match"
        )
    if sorted(linkage.links) != sorted(ds.party_names):
        raise LinkageError(
            f"linkage job {linkage.job_id} links parties {sorted(linkage.links)}, "
            f"the dataset has secondaries {sorted(ds.party_names)}"
        )
