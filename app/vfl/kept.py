"""A trained federation, kept: every party's state at the best-validation epoch (the one whose
test metric the run reports) and what predict needs to prepare new records alike.

    <run>/kept/federation.json   the manifest: run config, task head (label scaling), method, K,
                                 tau, the linkage job, the best epoch, and per party its feature
                                 transform (datasets/transform.py) and a digest of its features
    <run>/kept/primary.pt        the primary's model at the best epoch
    <run>/kept/<party>.pt        each secondary's model at the best epoch (in process; a deployed
                                 secondary keeps its own in its own folder)

:class:`Keeper` snapshots the states after each epoch's evaluation when the validation metric
improves (ties keep the earlier epoch, as strategies.records.best_epoch does).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from datasets import VFLDataset
from linkage.binding import identifier_digest
from strategies.heads import TaskHead
from strategies.records import EpochRecord

KEPT, MANIFEST = "kept", "federation.json"


class KeptError(ValueError):
    """No kept federation, or one that does not fit what predict was given."""


def features_digest(features: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(features, dtype=np.float32).tobytes()).hexdigest()


class Keeper:
    """The best-validation epoch's states, as the evaluation saw them."""

    def __init__(self, head: TaskHead) -> None:
        self.head, self.best = head, None
        self.states: dict[str, dict[str, torch.Tensor]] = {}

    def offer(self, rec: EpochRecord, models: dict[str, torch.nn.Module]) -> None:
        """``models``: "primary" and every secondary, right after the epoch's evaluation."""
        key = self.head.key_metric
        if self.best is None or self.head.better(rec.val[key], self.best.val[key]):
            self.best = rec
            self.states = {name: {k: v.detach().cpu().clone() for k, v in m.state_dict().items()}
                           for name, m in models.items()}

    def save(self, run_dir: Path, cfg, settings, ds: VFLDataset, job_id: str) -> Path:
        folder = Path(run_dir) / KEPT
        folder.mkdir(parents=True, exist_ok=True)
        for name, state in self.states.items():
            torch.save(state, folder / f"{name}.pt")
        (folder / MANIFEST).write_text(json.dumps(manifest(cfg, settings, ds, self.head, job_id, self.best.epoch),
                                                     indent=2))
        return folder


def _party(table) -> dict:
    return {"features": table.transform.to_json() if table.transform else None,
            "feature_names": list(map(str, table.feature_names)), "id_names": list(table.id_names),
            "id_kind": table.id_kind, "features_sha256": features_digest(table.features),
            "identifiers_sha256": identifier_digest(table.identifiers)}


def manifest(cfg, settings, ds: VFLDataset, head: TaskHead, job_id: str, best_epoch: int) -> dict:
    return {"mode": cfg.mode, "method": cfg.method, "dataset": ds.name, "best_epoch": best_epoch,
            "head": dataclasses.asdict(head), "job_id": job_id, "k": settings.k, "tau": cfg.tau,
            "run": dataclasses.asdict(cfg), "primary": _party(ds.primary),
            "secondaries": {p: _party(t) for p, t in ds.secondaries.items()}}


def read_manifest(run_dir: Path) -> dict:
    """federation.json; refused by name when the run kept none."""
    folder = Path(run_dir) / KEPT
    if not (folder / MANIFEST).exists():
        raise KeptError(f"run {Path(run_dir)} has no kept federation ({folder / MANIFEST} is missing): it did not "
                        "finish, or it was trained before runs kept their best epoch; train it again")
    return json.loads((folder / MANIFEST).read_text())


def load_kept(run_dir: Path) -> tuple[dict, dict[str, dict[str, torch.Tensor]]]:
    """(manifest, {"primary" | party: state dict})."""
    folder, meta = Path(run_dir) / KEPT, read_manifest(run_dir)
    names = ["primary", *meta["secondaries"]]
    missing = [n for n in names if not (folder / f"{n}.pt").exists()]
    if missing:
        raise KeptError(f"kept federation {folder} lacks the state of {missing}")
    return meta, {n: torch.load(folder / f"{n}.pt", map_location="cpu", weights_only=True) for n in names}
