"""Predict for entities with a kept Entity Augmentation run, every party in this process.

    predict_ea_in_process(run_dir, entity_ids (q,)) -> EAPrediction
    python -m app.entity_aug.predict RUN_DIR --ids ids.csv [--ids-column entity] --out predictions.csv

An entity is named by its id (the row index every party knows, datasets/overlap.py); predict
serves the entities every party holds: validation and test entities, and the training entities
every party holds in the overlap experiment (the aligned ones; all in the ``full`` variant; a
training entity in one party's own share is held by that party alone). The parties are rebuilt
from the run's config as training built them (app/entity_aug/parties.py), loaded with their
kept states, and evaluated as training's evaluation does: each party embeds the ids with its
local model (SecondaryParty.embed over a LocalChannel), the primary runs its model in eval mode
(PrimaryParty.outputs).

Over Flower (a run whose secondaries kept their own states) the primary's side is
app/entity_aug/predict_server.py, with the same checks and :func:`predicted`.

Refused by name, before any output: a run that did not finish, no kept federation (or one whose
secondaries kept their own states, over Flower), a party whose features changed since training, and
entity ids that are not whole numbers, NaN, outside the run's entities or not held by every
party (named by the user's ids and lines: app/entity_aug/predict_ids.py; exit 2, or with
--skip-invalid left out and listed). Repeated ids are fine: each row is predicted on its own (no
batch statistics in eval mode).

The CSV has the id column, ``prediction`` (the class) and ``p_<class>`` per class. Exit 0 only
with the output written; bad input exits 2, a failure 1, and an older file at --out is left
byte-identical (app/predict_files.py states the rule).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from app.config import RunConfig
from app.entity_aug.kept import PRIMARY_MODEL, features_digest, load_kept, state_name
from app.entity_aug.parties import build_party, build_primary, ea_data, ea_plan, ea_settings
from app.entity_aug.predict_ids import (  # noqa: F401 - re-exported
    entity_ids,
    held_by_every_party,
    id_column,
    read_ids,
    read_screened,
)
from app.kept import KeptError, predict_command, read_manifest, write_csv
from app.predict_files import list_skipped
from app.run_status import require_finished
from datasets.overlap import EntityData
from strategies.entity_aug.channel import LocalChannel
from strategies.heads import TaskHead
from strategies.torch_threads import torch_threads


@dataclass(frozen=True)
class EAPrediction:
    values: np.ndarray  # (q,) binary: P(y=1); multiclass: class id (TaskHead.predict)
    proba: np.ndarray | None  # (q, C) class probabilities (binary: C = 2)
    best_epoch: int
    seconds: dict[str, float]  # prepare (kept state, data, models), embed (the parties), forward (the primary)


def user_entities(ids, data: EntityData) -> np.ndarray:
    """(q,) entity indices of the parties' own ids (parties.toml entity_id: ``data.entity_ids``),
    compared as text; an id no party's label holder knows is refused by name. Without declared
    ids, the ids are the entities' row numbers (:func:`entity_ids`)."""
    if data.entity_ids is None:
        return entity_ids(ids)
    arr = np.asarray(ids)
    if arr.ndim != 1 or len(arr) == 0:
        raise KeptError(f"entity ids must be a non-empty list (q,), got shape {arr.shape}")
    lookup = {str(v): i for i, v in enumerate(data.entity_ids)}
    keys = [str(v) for v in arr]
    unknown = sorted({k for k in keys if k not in lookup})
    if unknown:
        raise KeptError(
            f"{len(unknown)} entity id(s) are not entities of the run (the label holder's ids): {unknown[:5]}"
        )
    return np.array([lookup[k] for k in keys], dtype=np.int64)


def check_ids(ids: np.ndarray, cfg: RunConfig, data: EntityData) -> None:
    n = len(data.labels)
    outside = (ids < 0) | (ids >= n)
    if outside.any():
        raise KeptError(
            f"{int(outside.sum())} of {len(ids)} entity id(s) are not entities of the run (0..{n - 1}): "
            f"{np.unique(ids[outside])[:5].tolist()}"
        )
    lacking = {p: np.unique(ids[~held[ids]]) for p, held in held_by_every_party(cfg, data).items()}
    lacking = {p: u for p, u in lacking.items() if len(u)}
    if lacking:
        union = np.unique(np.concatenate(list(lacking.values())))
        raise KeptError(
            f"{len(union)} entity id(s) are not held by every party: {union[:5].tolist()} (missing at "
            f"{ {p: len(u) for p, u in lacking.items()} }); predict serves the validation, test and "
            "aligned training entities"
        )


def check_parties(meta: dict, data: EntityData, names: list[str] | None = None) -> None:
    """Every party's (or those ``names``': the others check their own) features must be the ones
    the federation was trained on."""
    if data.parties != meta["parties"]:
        raise KeptError(f"the run's parties are now {data.parties}; the federation was trained with {meta['parties']}")
    for p in data.parties if names is None else names:
        if features_digest(data.blocks[p]) != meta["features_sha256"][p]:
            raise KeptError(
                f"party {p!r}: its data changed since training (features digest differs); predict "
                "with the data the federation was trained on, or train again"
            )


def rebuild(cfg: RunConfig, data: EntityData, meta: dict, states: dict, local: list[str] | None = None):
    """(primary, LocalChannel of every party, or of those ``local``) with the kept states, built
    as training built them."""
    primary, kept = build_primary(cfg, data), TaskHead(**meta["head"])
    if replace(primary.head, select=kept.select) != kept:  # the epoch's rule predicts nothing
        raise KeptError(
            f"the run's labels now give the task head {primary.head}; the federation was trained with {meta['head']}"
        )
    primary.model.load_state_dict(states[PRIMARY_MODEL])  # built in the run's dtype first: no float32 round trip
    parties = {p: build_party(cfg, p, data) for p in (data.parties if local is None else local)}
    for p, party in parties.items():
        party.load_state_dict(states[state_name(p)])  # its model and its shield
    return primary, LocalChannel(parties)


def predict_ea_in_process(run_dir: Path, ids) -> EAPrediction:
    t0 = time.perf_counter()
    require_finished(Path(run_dir), kept=True)
    meta, states = load_kept(Path(run_dir))
    cfg = RunConfig.of(**meta["run"])
    data = ea_data(cfg)
    ids = user_entities(ids, data)
    check_parties(meta, data)
    check_ids(ids, cfg, data)
    primary, channel = rebuild(cfg, data, meta, states)
    seconds = {"prepare": time.perf_counter() - t0, "embed": 0.0, "forward": 0.0}
    return predicted(primary, channel.embed, ids, ea_plan(cfg, data, ea_settings(cfg)).eval_batch, meta, seconds)


def predicted(primary, embed, ids: np.ndarray, batch: int, meta: dict, seconds: dict[str, float]) -> EAPrediction:
    """The primary's outputs over ``embed(chunk)`` (party -> (b, c_p)) in evaluation's chunks of
    ``batch`` (strategies.entity_aug.model.evaluate); ``seconds`` gains embed and forward."""
    outs = []
    with torch_threads(1):  # as training evaluated
        for i in range(0, len(ids), batch):
            t1 = time.perf_counter()
            acts = embed(ids[i : i + batch])  # party -> (b, c_p)
            t2 = time.perf_counter()
            outs.append(primary.outputs(acts, len(ids[i : i + batch])))  # (b, d_out); each party's checked
            seconds["embed"] += t2 - t1
            seconds["forward"] += time.perf_counter() - t2
    out = torch.cat(outs)  # (q, d_out)
    return EAPrediction(primary.head.predict(out), primary.head.probabilities(out), meta["best_epoch"], seconds)


# ---------------------------------------------------------------------------- CSV in, CSV out


def table(ids: np.ndarray, column: str, pred: EAPrediction) -> pd.DataFrame:
    """The id column, ``prediction`` (the class) and ``p_<class>`` per class."""
    cols = {column: np.asarray(ids), "prediction": pred.proba.argmax(axis=1)}
    return pd.DataFrame(cols | {f"p_{c}": pred.proba[:, c] for c in range(pred.proba.shape[1])})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--ids", type=Path, required=True, help="CSV with a column of entity ids")
    ap.add_argument(
        "--ids-column",
        default="",
        help="the column of --ids holding the entity ids (default: the column the run's parties declare, else 'entity')",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--skip-invalid",
        action="store_true",
        help="predict the ids the run can; list the others in <out stem>.skipped.csv (line, id, reason)",
    )
    args = ap.parse_args(argv)

    def predict(screened) -> str:
        ids, skipped, texts = screened
        pred = predict_ea_in_process(args.run_dir, ids)
        write_csv(table(texts, args.ids_column, pred), args.out)
        told = list_skipped(args.out, skipped, args.ids_column, args.skip_invalid)
        if told:
            print(told, file=sys.stderr)
        return f"{len(ids)} predictions (best epoch {pred.best_epoch}) -> {args.out}"

    return predict_command(
        args.out,
        args.ids,
        predict,
        check=lambda: load_kept(args.run_dir),
        read=lambda: _screened(args),
    )


def _screened(args: argparse.Namespace) -> tuple:
    """The ids to predict and the skipped (read_screened), in the run's id column unless given."""
    args.ids_column = id_column(args.ids_column, RunConfig.of(**read_manifest(args.run_dir)["run"]))
    return read_screened(args.run_dir, args.ids, args.ids_column, args.skip_invalid)


if __name__ == "__main__":
    sys.exit(main())
