"""An Entity Augmentation run, kept: every party's state at the best-validation epoch (the one
whose test metric the run reports) and what predict needs to rebuild the parties alike.

    <run>/kept/federation.json   the manifest: mode "entity-aug", the run config, the task head,
                                 the best epoch, the secondaries, the parties in the primary's
                                 input order, per party a digest of its entity-indexed features,
                                 and where the secondaries' states are ("secondary_states": "run":
                                 here; "parties": each secondary keeps its own; as app/vfl/kept.py)
    <run>/kept/host.pt           the primary's model over the parties' activations
    <run>/kept/host_block.pt     the local model of the primary's own feature block (only when the
                                 primary has features: it is a party of its own, named "host")
    <run>/kept/<secondary>.pt    each secondary's local model (in process)

(Primary and secondaries are the EA paper's host and guests; the file names keep "host".) A
manifest written by an older version says "guests" and "guest_states": "guests" | "run";
:func:`upgrade` reads it with the new keys.

The Keeper and the manifest's reading are both modes' (app/kept.py). Over Flower the primary
keeps its model and its own block; each secondary keeps its own in its own model folder
(app/node.py model_dir; simulation: <out-dir>/<run>/<secondary>/kept-<attempt>.pt, app/kept.py
attempt_id), told by the primary
right after the evaluation of an epoch that is the best so far (``query.ea_keep``): the epoch,
the state and a digest of the secondary's features (:func:`save_secondary_state`). Such a run's
manifest says ``"secondary_states": "parties"``; it predicts over Flower
(app/entity_aug/predict_server.py: each secondary embeds with its own kept state,
``query.ea_embed_kept``), not in process.
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
from datasets.overlap import PRIMARY_BLOCK, EntityData
from files.atomic import write_atomic
from files.private import private_dir
from strategies.heads import TaskHead

# state names of the primary's model and of its own block's model (the values, file names, are kept)
PRIMARY_MODEL, PRIMARY_BLOCK_STATE = "host", "host_block"


def features_digest(block: np.ndarray) -> str:
    """sha256 of a party's (n, d_p) features by entity id: dtype, shape and values."""
    block = np.ascontiguousarray(block)
    head = f"{block.dtype.str}{block.shape}".encode()
    return hashlib.sha256(head + block.tobytes()).hexdigest()


def state_name(party: str) -> str:
    """The kept state's name of a party's local model (the primary's own block is not the primary's model)."""
    return PRIMARY_BLOCK_STATE if party == PRIMARY_BLOCK else party


class Keeper(kept.Keeper):
    """app/kept.py's Keeper (states in memory until :meth:`save`), saving this mode's manifest."""

    def save(self, run_dir: Path, cfg, data: EntityData, *, secondaries_keep: bool = False) -> Path:
        """The states and the manifest. ``secondaries_keep``: the secondaries keep their own states (Flower)."""
        clash = sorted({PRIMARY_MODEL, PRIMARY_BLOCK_STATE} & set(data.secondaries))
        if clash:
            raise KeptError(f"a secondary may not be called {clash[0]!r}: the primary's kept states use that name")
        return self.write(
            run_dir, lambda best: manifest(cfg, data, self.head, best, "parties" if secondaries_keep else "run")
        )


def manifest(cfg, data: EntityData, head: TaskHead, best_epoch: int, secondary_states: str) -> dict:
    return {
        "mode": "entity-aug",
        "dataset": data.name,
        "best_epoch": best_epoch,
        "head": dataclasses.asdict(head),
        "run": cfg.flat(),
        "secondaries": data.secondaries,
        "parties": data.parties,
        "n_entities": int(len(data.labels)),
        "secondary_states": secondary_states,
        "features_sha256": {p: features_digest(b) for p, b in data.blocks.items() if p not in data.remote},
    }


def upgrade(meta: dict) -> dict:
    """A manifest with this version's keys: one written by an older version says "guests" and
    "guest_states" ("guests" = each kept its own), read as "secondaries" and "secondary_states"
    ("parties")."""
    meta = dict(meta)
    if "secondaries" not in meta and "guests" in meta:
        meta["secondaries"] = meta.pop("guests")
    if "secondary_states" not in meta and "guest_states" in meta:
        old = meta.pop("guest_states")
        meta["secondary_states"] = "parties" if old == "guests" else old
    return meta


def read_manifest(run_dir: Path) -> dict:
    """federation.json of an Entity Augmentation run (:func:`upgrade`d); refused by name when the run kept none."""
    meta = kept.read_manifest(run_dir)
    if meta.get("mode") != "entity-aug":
        raise KeptError(
            f"run {Path(run_dir)} kept a federation of mode {meta.get('mode')!r}, not 'entity-aug': "
            "predict it with its own mode's predict"
        )
    return upgrade(meta)


def load_kept(run_dir: Path) -> tuple[dict, dict[str, dict[str, torch.Tensor]]]:
    """(manifest, {state name: state dict}) with every party's state: the primary's model, its
    own block's (if any) and every secondary's."""
    folder, meta = Path(run_dir) / KEPT, read_manifest(run_dir)
    if meta["secondary_states"] != "run":
        raise KeptError(
            f"run {Path(run_dir)} trained over Flower: each secondary keeps its own state, so "
            f"predicting in process (which needs the secondaries {meta['secondaries']} here) cannot; "
            "predict it over Flower (`fedsim predict RUN ids.csv --out p.csv`, or `flwr run` with "
            "predict-run)"
        )
    return meta, kept.load_states(folder, kept_state_names(meta))


def kept_state_names(meta: dict) -> list[str]:
    """The states predict loads from the run folder of manifest ``meta``: every party's where the
    run kept them there (in process), else the primary's model and its own block's (if any)."""
    meta = upgrade(meta)
    in_run = meta.get("secondary_states", "run") == "run"
    return [PRIMARY_MODEL, *(state_name(p) for p in meta["parties"] if in_run or p == PRIMARY_BLOCK)]


def save_secondary_state(
    path: Path, epoch: int, state: dict[str, torch.Tensor], features: np.ndarray, plan: dict | None = None
) -> None:
    """A secondary's state at the best epoch so far (replacing its attempt's earlier one: ``path``
    is <its model folder of the run>/app.kept.party_kept_file(attempt), so a failed rerun's keeps
    leave the finished run's), with the epoch, the digest of the features it was trained on and,
    for a party met by its ids, the plan that built its block (app/entity_aug/id_exchange.py);
    0600 in a 0700 folder, written atomically."""
    private_dir(Path(path).parent)
    buf = io.BytesIO()
    kept = {
        "epoch": int(epoch),
        "features_sha256": features_digest(features),
        "state": {k: v.detach().cpu().clone() for k, v in state.items()},
    }
    if plan is not None:
        kept["plan"] = {k: torch.as_tensor(v) if isinstance(v, np.ndarray) else int(v) for k, v in plan.items()}
    torch.save(kept, buf)
    write_atomic(Path(path), buf.getvalue())


def secondary_plan(path: Path, party: str) -> dict:
    """The plan a secondary met by its ids kept with its state ({field: int, array: (m,) int64})."""
    kept = _read_kept(path, party)
    if "plan" not in kept:
        raise KeptError(f"secondary {party!r} kept no id-exchange plan for this run: it was trained on shared data")
    return {k: v.numpy() if isinstance(v, torch.Tensor) else int(v) for k, v in kept["plan"].items()}


def load_secondary_state(path: Path, party: str, features: np.ndarray) -> tuple[int, dict[str, torch.Tensor]]:
    """(epoch, state) a secondary kept at ``path``; refused by name when it kept none or its features changed."""
    kept = _read_kept(path, party)
    if kept["features_sha256"] != features_digest(features):
        raise KeptError(
            f"secondary {party!r}: its data changed since training (features digest differs); predict "
            "with the data the federation was trained on, or train again"
        )
    return int(kept["epoch"]), kept["state"]


def _read_kept(path: Path, party: str) -> dict:
    path = Path(path)
    if not path.exists():
        raise KeptError(
            f"secondary {party!r} keeps no model for this run ({path} is missing): it was trained in "
            "another place, or before secondaries kept their best epoch"
        )
    return torch.load(path, map_location="cpu", weights_only=True)
