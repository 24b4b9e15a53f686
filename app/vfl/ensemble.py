"""Predict with an ensemble of kept federations: members trained apart on the same data (run-config
`member`: the split of one seed, each member its own initial weights, dropout and batch order;
deep ensembles, TabM's members trained apart), their predictions averaged.

    predict_ensemble([run_0, run_1, ...], features (q, d_P), identifiers) -> Prediction

Each member predicts as it would alone (app/vfl/predict.py: its own linkage job, tokens and
kept models); the ensemble averages regression values, or class probabilities (binary: P(y=1)
is the mean of the members'; multiclass: the class of the highest mean probability). Refused by
name, before any member predicts: members of other datasets, tasks, classes or label scales, or
of other primary features (a CSV is read once, with the first member's recorded preparation).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.kept import KeptError, read_manifest
from app.run_status import require_finished
from app.vfl.predict import Prediction, predict_in_process

# what every member must share: the same data, task and label scale, the same primary features
SHARED = ("dataset", "head")
SHARED_PRIMARY = ("feature_names", "features", "features_sha256", "identifiers_sha256")


def check_members(run_dirs: list[Path]) -> list[dict]:
    """The members' manifests, every one finished and of the same data and task as the first."""
    if len(run_dirs) != len(set(Path(r).resolve() for r in run_dirs)):
        raise KeptError(f"an ensemble names a run twice: {[str(r) for r in run_dirs]}")
    metas = []
    for run_dir in run_dirs:
        require_finished(Path(run_dir))
        metas.append(read_manifest(Path(run_dir)))
    first = metas[0]
    for run_dir, meta in zip(run_dirs[1:], metas[1:], strict=True):
        differ = [k for k in SHARED if meta.get(k) != first.get(k)]
        differ += [f"primary {k}" for k in SHARED_PRIMARY if meta["primary"].get(k) != first["primary"].get(k)]
        if differ:
            raise KeptError(
                f"ensemble member {run_dir} differs from {run_dirs[0]} in {differ}: the members of an "
                "ensemble are runs of one dataset, task and seed's split (run-config member: 0, 1, 2, ...)"
            )
    return metas


def average(predictions: list[Prediction]) -> tuple[np.ndarray, np.ndarray | None]:
    """(values (q,), proba (q, C) | None) of the members' mean, as one model reports them."""
    if predictions[0].proba is None:  # regression: the mean value
        return np.mean([p.values for p in predictions], axis=0), None
    proba = np.mean([p.proba for p in predictions], axis=0)  # (q, C)
    values = proba[:, 1] if proba.shape[1] == 2 else proba.argmax(axis=1)  # binary: P(y=1); else the class
    return values, proba


def predict_ensemble(
    run_dirs: list[Path], features: np.ndarray, identifiers: np.ndarray, *, batch: int = 4096
) -> tuple[Prediction, list[Prediction]]:
    """(the ensemble's prediction, each member's). The ensemble's best_epoch is the first member's;
    its linkage and weights are the first member's (an explanation is per member)."""
    check_members(run_dirs)
    members = [predict_in_process(r, features, identifiers, batch=batch) for r in run_dirs]
    values, proba = average(members)
    seconds = {k: sum(m.seconds[k] for m in members) for k in members[0].seconds}
    first = members[0]
    return Prediction(values, proba, first.linkage, first.weights, first.best_epoch, seconds), members
