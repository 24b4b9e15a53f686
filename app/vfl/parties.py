"""Building each party's pieces from a run config: data, linkage view, models.

Shared by the ServerApp, the ClientApp, the one-process twin and the benchmarks so that
all of them start from identical data, linkage and initial weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from logging import INFO
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from flwr.common.logger import log
from threadpoolctl import threadpool_limits
from torch import nn

from app.config import RunConfig, Settings, plain_run_name
from app.data import load_data
from linkage.binding import bind_result, check_binding, upload_record, write_record
from linkage.contracts import DEFAULT_STRING_METRIC, LinkageError, LinkageResult, PrimaryLinkage
from linkage.job_secret import operator_secret, operator_seed_from_env, secret_for
from linkage.metrics import DEFAULT_OF_KIND
from linkage.metrics import metric as metric_named
from linkage.store import load_primary, save_job, save_privacy, write_atomic
from strategies.heads import TaskHead
from strategies.optim import build_seeded, party_seed
from strategies.vfl.fedsim import FedSimStrategy
from strategies.vfl.gates import seed_dropout
from strategies.vfl.methods import method as registered
from strategies.vfl.model import SimilarityModel, local_model
from strategies.vfl.protocol import TrainPlan

if TYPE_CHECKING:
    from datasets.base import VFLDataset


def run_linkage(ds: VFLDataset, cfg: RunConfig, settings: Settings) -> LinkageResult:
    """What the linkage service computes from both parties' identifiers, linked here on its behalf.

    Its randomness comes from the in-process service's own per-job secret (:func:`service_secret`),
    never from the run's seed, which the primary chooses."""
    return link_and_report(ds, cfg, settings, report=False)[0]


def require_linkable(ds: VFLDataset, cfg: RunConfig) -> None:
    """What the linkage would refuse about the data for this run's method (also checked by
    fedsim train before Flower starts): method 'combine' needs every record's true alignment."""
    if cfg.training_method.links == "known" and (not ds.true_match or any((r < 0).any() for r in ds.true_match.values())):
        raise ValueError(f"method 'combine' needs the true alignment of every record, which dataset "
                         f"{ds.name!r} does not have (synthetic sets only)")


def link_and_report(ds: VFLDataset, cfg: RunConfig, settings: Settings, *, report: bool = True,
                    max_tokens: int = 0) -> tuple[LinkageResult, dict | None]:
    """:func:`run_linkage`, and the job's privacy report (linkage.privacy) scored with both
    parties' identifiers as the service holds them (None: not asked for, or method 'combine',
    which links by the planted truth and releases no similarity). max_tokens: tokens attacked
    per party (0 = the report's default)."""
    from linkage.job import JobSpec  # scipy (linkage.pipeline) on first run: not per message

    with threadpool_limits(limits=1, user_api="blas"):  # see _load
        if cfg.training_method.links == "known":
            require_linkable(ds, cfg)
            sizes = {p: t.n_rows for p, t in ds.secondaries.items()}
            job = f"true-{ds.name}-{cfg.seed}-{cfg.n_rows}"
            spec = JobSpec("", 1, kind=job_kind(cfg.method))
            return spec.run(None, ds.true_match, secret=service_secret(cfg, job), job_id=job, sizes=sizes), None
        metric = metric_of(ds)
        primary, ids = ds.primary.identifiers, {p: t.identifiers for p, t in ds.secondaries.items()}
        if cfg.encoding == "bloom":
            primary, ids = encode_parties(primary, ids, metric, cfg.seed, settings.k)
            metric = DEFAULT_OF_KIND["bits"]
        train = ds.split.train
        spec = JobSpec(metric, settings.k, cfg.tau, kind=job_kind(cfg.method), layout=cfg.layout,
                       defences=cfg.defences())
        job = spec.content_id(primary, ids, train)
        result = spec.run(primary, ids, secret=service_secret(cfg, job), train_rows=train, job_id=job)
        if not report:
            return result, None
        from linkage.privacy import MAX_TOKENS, safe_report

        own = spec.attacked(ids)  # chain: the anchor's sims
        return result, safe_report(result, primary, ids, metric, parties=own, max_tokens=max_tokens or MAX_TOKENS,
                                   secret=service_secret(cfg, result.primary.job_id))  # keys the attacked sample


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
        raise LinkageError(f"linkage job {job_id}: its secret {path} is missing; the job's noise cannot be "
                           "reproduced without it")
    return secret_for(path)


def encode_parties(primary: np.ndarray, secondaries: dict[str, np.ndarray], metric: str, seed: int,
                   k: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Run config encoding="bloom": what each party does locally before uploading (README
    "Privacy-preserving linkage"): strings -> keyed q-gram Bloom filters, numbers -> FEDERAL
    interval filters; the service then links by Hamming distance. In one simulation process the
    parties' shared secret is derived from the seed; FEDERAL's bounds are the box holding every
    party's values and its t comes from the first secondary's values (encode.federal_key)."""
    from linkage.encode import encode_with_key, federal_key

    key: dict = {"secret": hashlib.sha256(f"fedsim-simulated-parties-{seed}".encode()).digest()}
    if metric_named(metric).kind == "numbers":  # (strings: any of linkage.contracts.STRING_METRICS)
        values = [np.asarray(v, np.float64) for v in (primary, *secondaries.values())]  # each (n_p, d)
        if len(values[1]) <= k:
            raise LinkageError(f"encoding='bloom': secondary {next(iter(secondaries))!r} has {len(values[1])} "
                               f"records, K = {k} needs more")
        lo = np.min([v.min(axis=0) for v in values], axis=0)  # (d,) the box holding every party's values
        hi = np.max([v.max(axis=0) for v in values], axis=0)
        key["federal"] = federal_key(values[1], k=k, lo=lo, hi=hi)
    return encode_with_key(primary, key), {p: encode_with_key(v, key) for p, v in secondaries.items()}


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
    if cfg.linkage_dir:
        folder = Path(cfg.linkage_dir).resolve()
        fetched = load_primary(folder)
        check_binding(fetched, folder, ds.primary.identifiers)
        linkage = check_linkage(fetched, ds, settings, cfg.layout)
    else:
        result, report = link_and_report(ds, cfg, settings, report=cfg.privacy_report)
        result = bind_result(result, ds.primary.identifiers)
        from app.node import (
            simulated_linkage_dir,  # where a simulated secondary looks for it
        )

        folder = simulated_linkage_dir(cfg, result.primary.job_id)
        save_job(result, folder)
        save_privacy(report, folder)
        write_record(folder, upload_record(result.primary.job_id, "primary", ds.primary.identifiers))
        linkage = load_primary(folder)
    return (linkage if settings.model.sort_gate else unsorted(linkage, cfg.seed)), folder


def job_privacy(folder: Path | None, linkage: PrimaryLinkage | None, tag: str) -> dict | None:
    """The linkage job's privacy report (linkage.privacy: written by the service, or by the
    in-process linker), logged; None for Solo or a job that came without one."""
    from linkage.privacy import report_lines
    from linkage.store import load_privacy

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
        links[p] = dataclasses.replace(party_link, tokens=np.take_along_axis(party_link.tokens, order, 1),
                                       sims=np.take_along_axis(party_link.sims, order, 1))
    return dataclasses.replace(linkage, links=links)


def check_linkage(linkage: PrimaryLinkage, ds: VFLDataset, settings: Settings,
                  layout: str = "independent") -> PrimaryLinkage:
    """Refuse a fetched linkage that does not fit this run (other K, rows or parties)."""
    if linkage.k != settings.k:
        raise LinkageError(f"linkage job {linkage.job_id} has K={linkage.k} but this run uses k={settings.k}; "
                           "set run-config k to match")
    if len(linkage.links) > 1 and linkage.layout != layout:
        raise LinkageError(f"linkage job {linkage.job_id} is a {linkage.layout!r} linkage of {len(linkage.links)} "
                           f"parties but this run uses layout={layout!r}; set run-config layout to match")
    if sorted(linkage.links) != sorted(ds.secondaries):
        raise LinkageError(f"linkage job {linkage.job_id} links parties {sorted(linkage.links)}, "
                           f"the dataset has secondaries {sorted(ds.secondaries)}")
    for party_link in linkage.links.values():
        if len(party_link.tokens) != ds.primary.n_rows:
            raise LinkageError(f"linkage job {linkage.job_id} covers {len(party_link.tokens)} primary records, "
                               f"the primary has {ds.primary.n_rows}")
    return linkage


def train_plan(cfg: RunConfig, settings: Settings) -> TrainPlan:
    return TrainPlan(settings.epochs, settings.batch_size, cfg.steps_per_exchange, cfg.seed, cfg.max_steps,
                     cfg.eval_chunk, pipeline=cfg.pipeline)


def head_for(ds: VFLDataset) -> TaskHead:
    return TaskHead.fit(ds.task, ds.labels[ds.split.train], ds.n_classes)


def build_primary_model(ds: VFLDataset, cfg: RunConfig, settings: Settings) -> SimilarityModel:
    head = head_for(ds)
    parties = {} if not cfg.training_method.federated else {p: settings.model.cut_dim for p in ds.secondaries}
    shared = cfg.layout == "chain"
    return build_seeded(party_seed(cfg.seed, "primary"), lambda: SimilarityModel(
        ds.primary.n_features, parties, settings.k, head.d_out, settings.model, head.squash_pairs, shared))


def build_secondary_model(d_in: int, party: str, cfg: RunConfig, settings: Settings) -> nn.Module:
    return build_seeded(party_seed(cfg.seed, party), lambda: local_model(d_in, settings.model))


def build_strategy(ds: VFLDataset, linkage: PrimaryLinkage | None, cfg: RunConfig,
                   settings: Settings) -> FedSimStrategy:
    device = cfg.torch_device()
    model = build_primary_model(ds, cfg, settings)
    strategy = FedSimStrategy(model, head_for(ds), linkage, ds.primary.features, ds.labels,
                              settings.lr, settings.weight_decay, device, cfg.torch_dtype())
    seed_dropout(strategy.model, party_seed(cfg.seed, "dropout"), device)
    return strategy


def secondary_features(cfg: RunConfig, party: str, cache_dir: str = "") -> np.ndarray:
    """A secondary's feature matrix. A deployed SuperNode runs every message in a fresh process;
    with a ``cache_dir`` (node config "cache-dir") it parses its CSVs once and later messages
    memory-map the saved matrix."""
    path = None
    if cache_dir:
        key = hashlib.sha256(json.dumps([cfg.dataset, cfg.data_dir, cfg.n_rows, cfg.seed, cfg.sigma_cf, party])
                             .encode()).hexdigest()[:16]
        path = Path(cache_dir) / f"features-{party}-{key}.npy"
        if path.exists():
            return np.load(path, mmap_mode="r")
    if cfg.dataset == "csv":  # a party's own CSV only: a deployed SuperNode needs no other file
        from datasets.csv_parties import load_secondary_party

        features = load_secondary_party(Path(cfg.data_dir), party).features
    else:
        ds = load_data(cfg)
        if party not in ds.secondaries:
            raise ValueError(f"unknown party {party!r} for dataset {cfg.dataset!r}; parties: {sorted(ds.secondaries)}")
        features = ds.secondaries[party].features
    if path is not None:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(features))
        write_atomic(path, buf.getvalue())
    return features


def simulation_party(cfg: RunConfig, partition_id: int) -> str:
    """In simulation, virtual node i plays the i-th secondary party (sorted by name)."""
    parties = sorted(load_data(cfg).secondaries)
    if not 0 <= partition_id < len(parties):
        raise ValueError(f"partition-id {partition_id} but dataset {cfg.dataset!r} has secondaries {parties}")
    return parties[partition_id]

