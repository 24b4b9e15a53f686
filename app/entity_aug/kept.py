"""An Entity Augmentation run, kept: every party's state at the best-validation epoch (the one
whose test metric the run reports) and what predict needs to rebuild the parties alike.

    <run>/kept/federation.json   the manifest: mode "entity-aug", the run config, the task head,
                                 the best epoch, the guests, the parties in the host's input
                                 order, per party a digest of its entity-indexed features, and
                                 where the guests' states are ("run": here; "guests": each guest
                                 keeps its own)
    <run>/kept/host.pt           the host's model over the parties' activations
    <run>/kept/host_block.pt     the local model of the host's own feature block (only when the
                                 host has features: it is a party of its own, named "host")
    <run>/kept/<guest>.pt        each guest's local model (in process)

:class:`Keeper` snapshots the states after each epoch's evaluation when the validation metric
improves (ties keep the earlier epoch, as strategies.records.best_epoch does). Over Flower the
host keeps its model and its own block; each guest would keep its own in its own folder, told
by the host when an epoch is the best so far (not implemented yet: such a run's manifest says
``"guest_states": "guests"`` and in-process predict refuses it by name).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import torch

from datasets.overlap import HOST, EntityData
from linkage.store import write_atomic
from strategies.heads import TaskHead
from strategies.records import EpochRecord

KEPT, MANIFEST = "kept", "federation.json"
HOST_MODEL, HOST_BLOCK = "host", "host_block"  # state names of the host's model and of its own block's model


class KeptError(ValueError):
    """No kept federation, or one that does not fit what predict was given."""


def features_digest(block: np.ndarray) -> str:
    """sha256 of a party's (n, d_p) features by entity id: dtype, shape and values."""
    block = np.ascontiguousarray(block)
    head = f"{block.dtype.str}{block.shape}".encode()
    return hashlib.sha256(head + block.tobytes()).hexdigest()


def state_name(party: str) -> str:
    """The kept state's name of a party's local model (the host's own block is not the host's model)."""
    return HOST_BLOCK if party == HOST else party


def _copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


class Keeper:
    """The best-validation epoch's states, as the evaluation saw them (in memory until :meth:`save`)."""

    def __init__(self, head: TaskHead) -> None:
        self.head, self.best = head, None
        self.states: dict[str, dict[str, torch.Tensor]] = {}

    def offer(self, rec: EpochRecord, models: dict[str, torch.nn.Module]) -> bool:
        """``models``: the ones this process keeps (state name -> module), right after the
        epoch's evaluation. True when the epoch is the best so far."""
        key = self.head.key_metric
        if self.best is not None and not self.head.better(rec.val[key], self.best.val[key]):
            return False
        self.best = rec
        self.states = {name: _copy(m) for name, m in models.items()}
        return True

    def save(self, run_dir: Path, cfg, data: EntityData, *, guests_keep: bool = False) -> Path:
        """The states and the manifest. ``guests_keep``: the guests keep their own states (Flower)."""
        if self.best is None:
            raise KeptError("no epoch was evaluated: nothing to keep")
        clash = sorted({HOST_MODEL, HOST_BLOCK} & set(data.guests))
        if clash:
            raise KeptError(f"a guest may not be called {clash[0]!r}: the host's kept states use that name")
        folder = Path(run_dir) / KEPT
        folder.mkdir(parents=True, exist_ok=True)
        for name, state in self.states.items():
            buf = io.BytesIO()
            torch.save(state, buf)
            write_atomic(folder / f"{name}.pt", buf.getvalue())
        meta = manifest(cfg, data, self.head, self.best.epoch, "guests" if guests_keep else "run")
        write_atomic(folder / MANIFEST, json.dumps(meta, indent=2).encode())
        return folder


def manifest(cfg, data: EntityData, head: TaskHead, best_epoch: int, guest_states: str) -> dict:
    return {"mode": "entity-aug", "dataset": data.name, "best_epoch": best_epoch, "head": dataclasses.asdict(head),
            "run": dataclasses.asdict(cfg), "guests": data.guests, "parties": data.parties,
            "n_entities": int(len(data.labels)), "guest_states": guest_states,
            "features_sha256": {p: features_digest(b) for p, b in data.blocks.items()}}


def read_manifest(run_dir: Path) -> dict:
    """federation.json of an Entity Augmentation run; refused by name when the run kept none."""
    folder = Path(run_dir) / KEPT
    if not (folder / MANIFEST).exists():
        raise KeptError(f"run {Path(run_dir)} has no kept federation ({folder / MANIFEST} is missing): it did not "
                        "finish, or it was trained before runs kept their best epoch; train it again")
    meta = json.loads((folder / MANIFEST).read_text())
    if meta.get("mode") != "entity-aug":
        raise KeptError(f"run {Path(run_dir)} kept a federation of mode {meta.get('mode')!r}, not 'entity-aug': "
                        "predict it with its own mode's predict")
    return meta


def load_kept(run_dir: Path) -> tuple[dict, dict[str, dict[str, torch.Tensor]]]:
    """(manifest, {state name: state dict}) with every party's state: the host's model, its
    own block's (if any) and every guest's."""
    folder, meta = Path(run_dir) / KEPT, read_manifest(run_dir)
    if meta["guest_states"] != "run":
        raise KeptError(f"run {Path(run_dir)} trained over Flower: each guest keeps its own state, so predicting "
                        f"in process (which needs the guests {meta['guests']} here) cannot; predicting over Flower "
                        "is to come")
    names = [HOST_MODEL, *map(state_name, meta["parties"])]
    missing = [n for n in names if not (folder / f"{n}.pt").exists()]
    if missing:
        raise KeptError(f"kept federation {folder} lacks the state of {missing}")
    return meta, {n: torch.load(folder / f"{n}.pt", map_location="cpu", weights_only=True) for n in names}
