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
(app/node.py:model_dir, ``kept.pt`` with its run config and a digest of its features): the
primary tells it when an epoch is the best so far (``query.keep``), right after the evaluation
and before the next step, so the kept state is the one the evaluation used.

:class:`Keeper` snapshots the states after each epoch's evaluation when the validation metric
improves (ties keep the earlier epoch, as strategies.records.best_epoch does).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import torch

from datasets import VFLDataset
from linkage.binding import identifier_digest
from linkage.store import write_atomic
from strategies.heads import TaskHead
from strategies.records import EpochRecord

KEPT, MANIFEST, BEST, PARTY_KEPT = "kept", "federation.json", "best.json", "kept.pt"


class KeptError(ValueError):
    """No kept federation, or one that does not fit what predict was given."""


def features_digest(features: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(features, dtype=np.float32).tobytes()).hexdigest()


def _copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


class Keeper:
    """The best-validation epoch's states, as the evaluation saw them. With ``folder`` (the
    Flower engine) every improvement is written at once, so a resumed run keeps the best epoch
    of its first part; without, the states wait in memory for :meth:`save`."""

    def __init__(self, head: TaskHead, folder: Path | None = None) -> None:
        self.head, self.folder, self.best = head, folder, None
        self.states: dict[str, dict[str, torch.Tensor]] = {}

    def resume(self, records: list[EpochRecord]) -> None:
        """Go on from the best epoch kept before the interruption, among the epochs ``records`` holds."""
        path = None if self.folder is None else self.folder / BEST
        if path is None or not path.exists():
            return
        best = json.loads(path.read_text())
        for rec in records:
            if rec.epoch == best["epoch"]:
                self.best = rec

    def offer(self, rec: EpochRecord, models: dict[str, torch.nn.Module]) -> bool:
        """``models``: the ones this process keeps ("primary", and in process every secondary),
        right after the epoch's evaluation. True when the epoch is the best so far."""
        key = self.head.key_metric
        if self.best is not None and not self.head.better(rec.val[key], self.best.val[key]):
            return False
        self.best = rec
        self.states = {name: _copy(m) for name, m in models.items()}
        if self.folder is not None:
            self._write_states()
            write_atomic(self.folder / BEST, json.dumps({"epoch": rec.epoch, "val": rec.val}).encode())
        return True

    def _write_states(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for name, state in self.states.items():
            buf = io.BytesIO()
            torch.save(state, buf)
            write_atomic(self.folder / f"{name}.pt", buf.getvalue())

    def save(self, run_dir: Path, cfg, settings, ds: VFLDataset, job_id: str, *, parties_keep: bool = False) -> Path:
        """The manifest (and, in memory mode, the states). ``parties_keep``: the secondaries kept
        their own states (Flower); else they are in this folder."""
        if self.best is None:
            raise KeptError("no epoch was evaluated: nothing to keep")
        self.folder = Path(run_dir) / KEPT
        if self.states:
            self._write_states()
        meta = manifest(cfg, settings, ds, self.head, job_id, self.best.epoch)
        meta["secondary_states"] = "none" if cfg.method == "solo" else "parties" if parties_keep else "run"
        write_atomic(self.folder / MANIFEST, json.dumps(meta, indent=2).encode())
        return self.folder


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
    """(manifest, {"primary" | party: state dict}): the secondaries' states only when they are
    kept in the run folder (in process); through Flower each secondary holds its own."""
    folder, meta = Path(run_dir) / KEPT, read_manifest(run_dir)
    in_run = meta.get("secondary_states", "run") == "run"
    names = ["primary", *(meta["secondaries"] if in_run else [])]
    missing = [n for n in names if not (folder / f"{n}.pt").exists()]
    if missing:
        raise KeptError(f"kept federation {folder} lacks the state of {missing}")
    return meta, {n: torch.load(folder / f"{n}.pt", map_location="cpu", weights_only=True) for n in names}
