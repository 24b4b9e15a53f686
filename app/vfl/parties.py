"""Building each party's pieces from a run config: models, strategy, features (the linkage: linking.py).

Shared by the ServerApp, the ClientApp, the one-process twin and the benchmarks so that
all of them start from identical data, linkage and initial weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from torch import nn

from app.config import RunConfig, Settings
from app.data import dataset_options, load_data
from datasets.options import SPEC
from files.atomic import write_atomic
from linkage.contracts import PrimaryLinkage
from strategies.heads import TaskHead
from strategies.optim import build_seeded, party_seed
from strategies.vfl.gates import seed_dropout
from strategies.vfl.model import SimilarityModel, local_model
from strategies.vfl.primary import Optim, PrimaryParty
from strategies.vfl.protocol import TrainPlan

if TYPE_CHECKING:
    from datasets.base import VFLDataset


def train_plan(cfg: RunConfig, settings: Settings) -> TrainPlan:
    return TrainPlan(
        cfg.stop_rule(settings.epochs, settings.patience),
        settings.batch_size,
        cfg.train.steps_per_exchange,
        cfg.train.model_seed,
        cfg.runtime.eval_chunk,
        pipeline=cfg.train.pipeline,
        lr_decay=cfg.train.lr_decay,
        lr_patience=cfg.train.lr_patience,
    )


def head_for(ds: VFLDataset, settings: Settings) -> TaskHead:
    return TaskHead.fit(ds.task, ds.labels[ds.split.train], ds.n_classes, early_stopping=settings.patience > 0)


def build_primary_model(ds: VFLDataset, cfg: RunConfig, settings: Settings) -> SimilarityModel:
    head = head_for(ds, settings)
    parties = {} if not cfg.training_method.federated else {p: settings.model.cut_dim for p in ds.party_names}
    shared = cfg.link.layout == "chain"
    return build_seeded(
        party_seed(cfg.train.model_seed, "primary"),
        lambda: SimilarityModel(
            ds.primary.n_features, parties, settings.k, head.d_out, settings.model, head.squash_pairs, shared
        ),
    )


def build_secondary_model(d_in: int, party: str, cfg: RunConfig, settings: Settings) -> nn.Module:
    return build_seeded(party_seed(cfg.train.model_seed, party), lambda: local_model(d_in, settings.model))


def build_strategy(ds: VFLDataset, linkage: PrimaryLinkage | None, cfg: RunConfig, settings: Settings) -> PrimaryParty:
    device = cfg.torch_device()
    model = build_primary_model(ds, cfg, settings)
    optim = Optim(settings.lr, settings.weight_decay)
    on = (device, cfg.torch_dtype())
    strategy = PrimaryParty(model, head_for(ds, settings), linkage, ds.primary.features, ds.labels, optim, on)
    seed_dropout(strategy.model, party_seed(cfg.train.model_seed, "dropout"), device)
    return strategy


def feature_cache_key(cfg: RunConfig, party: str) -> str:
    """What a cached feature matrix was built from: the dataset, its folder, every loader option
    (the input recipe included) and, for a csv party, its parties.toml and its own CSV as they are
    now (path, size, modification time), so a party that edits either never reads stale features."""
    parts: list = [cfg.data.dataset, cfg.data.data_dir, party, dataclasses.asdict(dataset_options(cfg))]
    if cfg.data.dataset == "csv":  # read with tomllib only: a cache hit must not import pandas
        spec = Path(cfg.data.data_dir).expanduser().absolute() / SPEC
        try:
            own = tomllib.loads(spec.read_text()).get("secondaries", {}).get(party, {}).get("file")
        except (OSError, tomllib.TOMLDecodeError, AttributeError):
            own = None  # the load below refuses the folder by name
        files = [spec] + ([spec.parent / own] if isinstance(own, str) else [])
        parts += [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files if f.exists()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def secondary_features(cfg: RunConfig, party: str, cache_dir: str = "") -> np.ndarray:
    """A secondary's feature matrix. A deployed SuperNode runs every message in a fresh process;
    with a ``cache_dir`` (node config "cache-dir") it parses its CSVs once and later messages
    memory-map the saved matrix."""
    path = None
    if cache_dir:
        path = Path(cache_dir) / f"features-{party}-{feature_cache_key(cfg, party)}.npy"
        if path.exists():
            return np.load(path, mmap_mode="r")
    if cfg.data.dataset == "csv":  # a party's own CSV only: a deployed SuperNode needs no other file
        from datasets.csv_views import load_secondary_party  # lazy: pandas, off the ClientApp's per-message imports

        features = load_secondary_party(Path(cfg.data.data_dir), party, cfg.data.scale).features
    else:
        ds = load_data(cfg)
        if party not in ds.secondaries:
            raise ValueError(
                f"unknown party {party!r} for dataset {cfg.data.dataset!r}; parties: {sorted(ds.secondaries)}"
            )
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
        raise ValueError(f"partition-id {partition_id} but dataset {cfg.data.dataset!r} has secondaries {parties}")
    return parties[partition_id]


def epochs_note(max_epochs: int, patience: int) -> str:
    """The log's word on how long a run trains."""
    if patience > 0:
        return f"up to {max_epochs} epochs (stops after {patience} without a better validation metric)"
    return f"{max_epochs} epochs"
