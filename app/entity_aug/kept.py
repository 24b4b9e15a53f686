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
host keeps its model and its own block; each guest keeps its own in its own model folder
(app/node.py model_dir; simulation: <out-dir>/<run>/<guest>/kept.pt), told by the host right
after the evaluation of an epoch that is the best so far (``query.ea_keep``): the epoch, the
state and a digest of the guest's features (:func:`save_guest_state`). Such a run's manifest
says ``"guest_states": "guests"``; it predicts over Flower (app/entity_aug/predict_server.py:
each guest embeds with its own kept state, ``query.ea_embed_kept``), not in process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from pathlib import Path

import numpy as np
import torch

from app import kept
from app.kept import KEPT, KeptError
from datasets.overlap import HOST, EntityData
from linkage.private import private_dir
from linkage.store import write_atomic
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
                        f"in process (which needs the guests {meta['guests']} here) cannot; predict it over Flower "
                        "(`fedsim predict RUN ids.csv --out p.csv`, or `flwr run` with predict-run)")
    return meta, kept.load_states(folder, [HOST_MODEL, *map(state_name, meta["parties"])])


GUEST_KEPT = "kept.pt"  # a guest's own kept state, in its model folder of the run


def save_guest_state(folder: Path, epoch: int, state: dict[str, torch.Tensor], features: np.ndarray) -> None:
    """A guest's state at the best epoch so far (replacing an earlier one), with the epoch and
    the digest of the features it was trained on; 0600 in a 0700 folder, written atomically."""
    private_dir(folder)
    buf = io.BytesIO()
    torch.save({"epoch": int(epoch), "features_sha256": features_digest(features),
                "state": {k: v.detach().cpu().clone() for k, v in state.items()}}, buf)
    write_atomic(Path(folder) / GUEST_KEPT, buf.getvalue())


def load_guest_state(folder: Path, party: str, features: np.ndarray) -> tuple[int, dict[str, torch.Tensor]]:
    """(epoch, state) a guest kept; refused by name when it kept none or its features changed."""
    path = Path(folder) / GUEST_KEPT
    if not path.exists():
        raise KeptError(f"guest {party!r} keeps no model for this run ({path} is missing): it was trained in "
                        "another place, or before guests kept their best epoch")
    kept = torch.load(path, map_location="cpu", weights_only=True)
    if kept["features_sha256"] != features_digest(features):
        raise KeptError(f"guest {party!r}: its data changed since training (features digest differs); predict "
                        "with the data the federation was trained on, or train again")
    return int(kept["epoch"]), kept["state"]
