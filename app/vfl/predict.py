"""Predict for new primary records with a kept federation, every party in this process (the
in-process engine; through Flower: app/vfl/predict_server.py, which shares the pieces here).

    predict_in_process(run_dir, features (q, d_P), identifiers (q, d) | (q,)) -> Prediction

The new records are linked as the job linked its own (linkage/query.py: the job's training
statistics, sigma and tokens; noise keyed by the record), each secondary embeds the tokens it is
asked for with its kept model, and the primary runs its kept local model, gates and head, the
evaluation's own code (PrimaryParty.predict). Refused by name, before any output: a run that
did not finish or kept nothing, a secondary whose data changed since training, new records
whose features or identifiers do not fit, and linkages that predict does not support yet.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from app.config import RunConfig
from app.data import primary_data
from app.kept import KeptError, kept_attempt
from app.node import simulated_linkage_dir
from app.run_status import require_finished
from app.vfl.kept import features_digest, load_kept
from app.vfl.linking import metric_of, parties_key, service_secret, simulated_secret, unsorted
from app.vfl.parties import build_primary_model
from app.vfl.secondary import SecondaryParty
from linkage.binding import identifier_digest
from linkage.encode import encode_with_key
from linkage.query import QueryJob, query
from linkage.store import load_primary, load_secondary
from strategies.heads import TaskHead
from strategies.vfl.methods import REGISTRY
from strategies.vfl.party_keys import party_key
from strategies.vfl.primary import PrimaryParty

UNSUPPORTED = {name: m.no_predict for name, m in REGISTRY.items() if m.no_predict}  # method -> why not


@dataclass(frozen=True)
class Prediction:
    values: np.ndarray  # (q,) regression: label units; binary: P(y=1); multiclass: class id
    proba: np.ndarray | None  # (q, C) class probabilities (binary: C = 2); None for regression
    linkage: object  # the new records' PrimaryLinkage (tokens, noisy similarities), None for Solo
    weights: dict[str, np.ndarray]  # per secondary (q, K): the weight each linked record got
    best_epoch: int
    seconds: dict[str, float]  # prepare (kept state, data, models), query (linkage), embed, forward
    # fedsim_attn, per secondary (q, K + 1): the attention's weight on each linked record and the null slot
    attention: dict[str, np.ndarray] = field(default_factory=dict)


def _kept_run(run_dir: Path) -> tuple[dict, dict, RunConfig, object]:
    """(manifest, kept states, the run's config, its resolved settings) of a run predict supports."""
    require_finished(run_dir, kept=True)
    meta, states = load_kept(run_dir)
    cfg = RunConfig.of(**meta["run"])
    settings = cfg.resolve()
    order_dependent = not settings.model.sort_gate and settings.model.merge in ("cnn", "mlp")
    if cfg.train.method in UNSUPPORTED or order_dependent:
        raise KeptError(
            f"predict does not support this run: method {cfg.train.method!r}, sort gate "
            f"{settings.model.sort_gate} with merge {settings.model.merge!r} (supported: "
            f"every method but {sorted(UNSUPPORTED)}, and no "
            "order-dependent merge without the sort gate: its neighbour order is per batch)"
        )
    return meta, states, cfg, settings


def _check_parties(meta: dict, ds, names: tuple[str, ...] | None = None) -> None:
    """Every party's data held here (or those ``names``) must be what the federation was trained
    on; a remote party (its data on its own host) checks its own."""
    tables = {"primary": ds.primary, **ds.secondaries}
    kept = {"primary": meta["primary"], **meta["secondaries"]}
    if {"primary", *ds.party_names} != set(kept):
        raise KeptError(
            f"the run's parties are now {sorted(['primary', *ds.party_names])}; the federation was trained with "
            f"{sorted(kept)}"
        )
    for name, table in tables.items():
        if (names is not None and name not in names) or kept[name].get("remote"):
            continue
        for what, digest in (
            ("features", features_digest(table.features)),
            ("identifiers", identifier_digest(table.identifiers)),
        ):
            if digest != kept[name][f"{what}_sha256"]:
                raise KeptError(
                    f"party {name!r}: its data changed since training ({what} digest differs); "
                    "predict with the data the federation was trained on, or train again"
                )


def check_new(features: np.ndarray, identifiers: np.ndarray, meta: dict) -> None:
    names = meta["primary"]["feature_names"]
    if features.ndim != 2 or features.shape[1] != len(names):
        raise KeptError(
            f"new records have features of shape {features.shape}; the primary was trained on "
            f"{len(names)} features {names[:8]}..."
        )
    if not np.isfinite(features).all():
        raise KeptError(
            f"new records: {int((~np.isfinite(features)).any(axis=1).sum())} row(s) with non-finite features"
        )
    if len(identifiers) != len(features):
        raise KeptError(f"new records: {len(identifiers)} identifier rows but {len(features)} feature rows")


@dataclass
class KeptRun:
    """A kept federation opened for predict: the primary's side, ready to forward."""

    meta: dict
    states: dict  # "primary" (and the secondaries' states when kept in the run folder)
    cfg: RunConfig
    settings: object
    ds: object  # the run's data as the primary loads it
    model: torch.nn.Module  # the primary's model at the best epoch
    head: TaskHead
    attempt: str = ""  # the training attempt whose states the secondaries kept (app/kept.py), read with the manifest


def open_kept(run_dir: Path, *, check: tuple[str, ...] | None = None) -> KeptRun:
    """The run's kept federation, its data checked against training's digests (``check``: the
    parties to check; None = all, in process)."""
    attempt = kept_attempt(Path(run_dir))  # with the manifest, once: a rerun under the name later is another attempt
    meta, states, cfg, settings = _kept_run(Path(run_dir))
    ds = primary_data(cfg)  # as training read it: with the service's linkage, the primary's own file only
    _check_parties(meta, ds, check)
    model = build_primary_model(ds, cfg, settings).to(cfg.torch_dtype())  # before loading: no float32 round trip
    model.load_state_dict(states["primary"])
    return KeptRun(meta, states, cfg, settings, ds, model, TaskHead(**meta["head"]), attempt)


def forward(kept: KeptRun, features: np.ndarray, linkage, lookup: dict, batch: int = 4096, explain: bool = False):
    """(values (q,), proba (q, C) | None, weights per secondary (q, K), attention per secondary
    (q, K + 1), empty unless fedsim_attn and ``explain``: a second pass, only for the explanation):
    the evaluation's own code."""
    cfg = kept.cfg
    on = (cfg.torch_device(), cfg.torch_dtype())
    strategy = PrimaryParty(kept.model, kept.head, linkage, features, np.zeros(len(features)), on=on)  # no step
    rows = np.arange(len(features))
    out = torch.cat([strategy.outputs(rows[i : i + batch], lookup) for i in range(0, len(rows), batch)])  # (q, d_out)
    attention = {}
    if explain and kept.settings.model.attention and linkage is not None:
        parts = [strategy.attention(rows[i : i + batch], lookup) for i in range(0, len(rows), batch)]
        attention = {p: np.concatenate([part[p] for part in parts]) for p in parts[0]}
    return kept.head.predict(out), kept.head.probabilities(out), _weights(kept.model, linkage), attention


def predict_in_process(
    run_dir: Path, features: np.ndarray, identifiers: np.ndarray, *, batch: int = 4096, explain: bool = False
) -> Prediction:
    t0 = time.perf_counter()
    kept = open_kept(Path(run_dir))
    if kept.meta.get("secondary_states") == "parties":
        raise KeptError(
            f"run {run_dir} trained through Flower: each secondary keeps its own model in its own "
            "folder; predict through `flwr run` with run-config predict-run (app/vfl/predict_server.py)"
        )
    features, identifiers = np.asarray(features), np.asarray(identifiers)
    check_new(features, identifiers, kept.meta)
    seconds = {"prepare": time.perf_counter() - t0, "query": 0.0, "embed": 0.0}
    linkage, lookup = None, {}
    if kept.cfg.training_method.federated:
        linkage = link_here(kept, identifiers, seconds)
        lookup = _embed_here(kept, linkage, seconds)
    t1 = time.perf_counter()
    values, proba, weights, attention = forward(kept, features, linkage, lookup, batch, explain)
    seconds["forward"] = time.perf_counter() - t1
    return Prediction(values, proba, linkage, weights, kept.meta["best_epoch"], seconds, attention)


@torch.no_grad()
def _weights(model, linkage) -> dict[str, np.ndarray]:
    """Per secondary (q, K): the weight its path gave each linked record (weight gate, raw
    similarity, or uniform), for the explanation."""
    if linkage is None:
        return {}
    param = next(model.parameters())
    paths = {
        p: model.paths[party_key(p) if party_key(p) in model.paths else "all"] for p in linkage.links
    }  # "all": shared
    return {
        p: paths[p].weights(torch.as_tensor(link.sims, dtype=param.dtype, device=param.device)).cpu().numpy()
        for p, link in linkage.links.items()
    }


def link_here(kept: KeptRun, identifiers: np.ndarray, seconds: dict[str, float]):
    """The new records' linkage against the run's job, linked in this process as the run's
    in-process service linked it (its secret, never a new one: that would re-draw the noise)."""
    cfg, ds, meta = kept.cfg, kept.ds, kept.meta
    if cfg.link.linkage_dir:
        raise KeptError(
            f"the run was linked by the linkage service (linkage-dir {cfg.link.linkage_dir}): its new records "
            "are linked by the service too; query it (`python -m linkage_server query`, `python -m deploy "
            "predict`) and pass the answer as run-config predict-linkage"
        )
    folder = simulated_linkage_dir(cfg, meta["job_id"])
    trained = load_primary(folder)
    if trained.job_id != meta["job_id"]:
        raise KeptError(
            f"linkage folder {folder} holds job {trained.job_id}, but the federation was trained on "
            f"job {meta['job_id']}"
        )
    t0 = time.perf_counter()
    secret = service_secret(cfg, trained.job_id, create=False)
    maps = {p: load_secondary(folder, p).row_of_token for p in ds.secondaries}  # the service holds every map
    identifiers, base = as_uploaded(kept, identifiers)
    linkage = query(identifiers, QueryJob(base, trained, maps), secret=secret)
    seconds["query"] = time.perf_counter() - t0
    return linkage if kept.settings.model.sort_gate else unsorted(linkage, cfg.train.seed)


def as_uploaded(kept: KeptRun, identifiers: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(the new records' identifiers, each secondary's) as the run's parties uploaded them: raw, or
    (encoding bloom) encoded with the parties' key of the run, derived from the training data
    as training derived it (app.vfl.linking.parties_key), never a new one."""
    ds, cfg = kept.ds, kept.cfg
    base = {p: t.identifiers for p, t in ds.secondaries.items()}
    if cfg.link.encoding != "bloom":
        return identifiers, base
    key = parties_key(ds.primary.identifiers, base, metric_of(ds), kept.settings.k, simulated_secret(cfg.train.seed))
    return encode_with_key(identifiers, key), {p: encode_with_key(v, key) for p, v in base.items()}


def _embed_here(kept: KeptRun, linkage, seconds: dict[str, float]) -> dict:
    """Each secondary's embeddings of the tokens it is asked for, with its kept model (per
    party: sorted tokens (T,), embeddings (T, c))."""
    t0 = time.perf_counter()
    folder = simulated_linkage_dir(kept.cfg, kept.meta["job_id"])
    lookup = {}
    for p in kept.ds.secondaries:
        party = SecondaryParty(kept.cfg, p, str(folder))
        party.load_state_dict(kept.states[p])  # embedded as in training's evaluation (no dropout there)
        tokens = np.unique(linkage.links[p].tokens)
        lookup[p] = (tokens, party.embed(tokens))
    seconds["embed"] = time.perf_counter() - t0
    return lookup
