"""A trained federation, kept: every party's state at the best-validation epoch (the one whose
test metric the run reports) and what predict needs to prepare new records alike.

    <run>/kept/federation.json   the manifest: run config, task head (label scaling), method, K,
                                 tau, the linkage job, the best epoch, and per party its feature
                                 transform (datasets/transform.py) and a digest of its features
    <run>/kept/primary.pt        the primary's model at the best epoch
    <run>/kept/<party>.pt        each secondary's model at the best epoch (in process)
    <run>/kept/best.json         the best epoch so far and its validation metrics (a resumed run
                                 goes on from it)

Through Flower each secondary keeps its own state, in its own folder for the run
(app/node.py:model_dir, ``kept-<attempt>.pt`` with its run config and a digest of its features: app/kept.py
attempt_id, so a rerun that fails leaves the finished run's): the
primary tells it when an epoch is the best so far (``query.keep``), right after the evaluation
and before the next step, so the kept state is the one the evaluation used.

The Keeper and the manifest's reading are both modes' (app/kept.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import torch

from app import kept
from app.kept import KEPT, read_manifest
from datasets import VFLDataset
from linkage.binding import identifier_digest
from strategies.heads import TaskHead


def features_digest(features: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(features, dtype=np.float32).tobytes()).hexdigest()


class Keeper(kept.Keeper):
    """app/kept.py's Keeper, saving this mode's manifest."""

    def save(self, run_dir: Path, cfg, settings, ds: VFLDataset, job_id: str, *, parties_keep: bool = False) -> Path:
        """The manifest (and, in memory mode, the states). ``parties_keep``: the secondaries kept
        their own states (Flower); else they are in this folder."""
        states = "none" if not cfg.training_method.federated else "parties" if parties_keep else "run"
        return self.write(
            run_dir, lambda best: {**manifest(cfg, settings, ds, self.head, job_id, best), "secondary_states": states}
        )


def _party(table) -> dict:
    return {
        "features": table.transform.to_json() if table.transform else None,
        "feature_names": list(map(str, table.feature_names)),
        "id_names": list(table.id_names),
        "id_kind": table.id_kind,
        "features_sha256": features_digest(table.features),
        "identifiers_sha256": identifier_digest(table.identifiers),
    }


def manifest(cfg, settings, ds: VFLDataset, head: TaskHead, job_id: str, best_epoch: int) -> dict:
    return {
        "mode": cfg.train.mode,
        "method": cfg.train.method,
        "dataset": ds.name,
        "best_epoch": best_epoch,
        "head": dataclasses.asdict(head),
        "job_id": job_id,
        "k": settings.k,
        "tau": cfg.link.tau,
        "run": cfg.flat(),
        "primary": _party(ds.primary),
        # a remote party (the primary's view: its data on its own host) keeps its own digests (its kept state)
        "secondaries": {
            **{p: _party(t) for p, t in ds.secondaries.items()},
            **{p: {"remote": True} for p in ds.remote},
        },
    }


def load_kept(run_dir: Path) -> tuple[dict, dict[str, dict[str, torch.Tensor]]]:
    """(manifest, {"primary" | party: state dict}): the secondaries' states only when they are
    kept in the run folder (in process); through Flower each secondary holds its own."""
    folder, meta = Path(run_dir) / KEPT, read_manifest(run_dir)
    return meta, kept.load_states(folder, kept_state_names(meta))


def kept_state_names(meta: dict) -> list[str]:
    """The states predict loads from the run folder of manifest ``meta``: the primary's, and the
    secondaries' where the run kept them there (in process; through Flower each keeps its own)."""
    in_run = meta.get("secondary_states", "run") == "run"
    return ["primary", *(meta["secondaries"] if in_run else [])]
