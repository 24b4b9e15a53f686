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

The Keeper and the manifest's reading are both modes' (app/kept.py). Over Flower the
host keeps its model and its own block; each guest would keep its own in its own folder, told
by the host when an epoch is the best so far (not implemented yet: such a run's manifest says
``"guest_states": "guests"`` and in-process predict refuses it by name).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import torch

from app import kept
from app.kept import KEPT, KeptError
from datasets.overlap import HOST, EntityData
from strategies.heads import TaskHead

HOST_MODEL, HOST_BLOCK = "host", "host_block"  # state names of the host's model and of its own block's model


def features_digest(block: np.ndarray) -> str:
    """sha256 of a party's (n, d_p) features by entity id: dtype, shape and values."""
    block = np.ascontiguousarray(block)
    head = f"{block.dtype.str}{block.shape}".encode()
    return hashlib.sha256(head + block.tobytes()).hexdigest()


def state_name(party: str) -> str:
    """The kept state's name of a party's local model (the host's own block is not the host's model)."""
    return HOST_BLOCK if party == HOST else party


class Keeper(kept.Keeper):
    """app/kept.py's Keeper (states in memory until :meth:`save`), saving this mode's manifest."""

    def save(self, run_dir: Path, cfg, data: EntityData, *, guests_keep: bool = False) -> Path:
        """The states and the manifest. ``guests_keep``: the guests keep their own states (Flower)."""
        clash = sorted({HOST_MODEL, HOST_BLOCK} & set(data.guests))
        if clash:
            raise KeptError(f"a guest may not be called {clash[0]!r}: the host's kept states use that name")
        return self.write(run_dir, lambda best: manifest(cfg, data, self.head, best, "guests" if guests_keep else "run"))


def manifest(cfg, data: EntityData, head: TaskHead, best_epoch: int, guest_states: str) -> dict:
    return {"mode": "entity-aug", "dataset": data.name, "best_epoch": best_epoch, "head": dataclasses.asdict(head),
            "run": dataclasses.asdict(cfg), "guests": data.guests, "parties": data.parties,
            "n_entities": int(len(data.labels)), "guest_states": guest_states,
            "features_sha256": {p: features_digest(b) for p, b in data.blocks.items()}}


def read_manifest(run_dir: Path) -> dict:
    """federation.json of an Entity Augmentation run; refused by name when the run kept none."""
    meta = kept.read_manifest(run_dir)
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
    return meta, kept.load_states(folder, [HOST_MODEL, *map(state_name, meta["parties"])])
