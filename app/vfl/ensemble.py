"""Predict with an ensemble of kept federations: members trained apart on the same data (run-config
`member`: the split of one seed, each member its own initial weights, dropout and batch order;
deep ensembles, TabM's members trained apart), their predictions averaged.

    predict_ensemble([run_0, run_1, ...], features (q, d_P), identifiers) -> Prediction

Each member predicts as it would alone (app/vfl/predict.py: its own linkage job, tokens and
kept models); the ensemble averages regression values, or class probabilities (binary: P(y=1)
is the mean of the members'; multiclass: the class of the highest mean probability). Refused by
name, before any member predicts: members of other datasets, tasks, classes, label scales, seeds
or primary features (a CSV is read once, with the first member's recorded preparation), the
same member twice, runs trained through Flower (each secondary keeps its own state), and with
noise (tau < 1) members of different linkage releases.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.kept import KeptError, read_manifest, read_outputs
from app.run_status import require_finished
from app.vfl.predict import Prediction, predict_in_process
from strategies.heads import TaskHead

# what every member must share: the same data, task and label scale, the same primary features
SHARED = ("mode", "dataset", "head", "secondary_states")
SHARED_RUN = ("seed", "tau")  # the split's seed; the linkage's noise scale
SHARED_PRIMARY = ("feature_names", "features", "features_sha256", "identifiers_sha256")


def check_members(run_dirs: list[Path], *, in_process: bool = True) -> list[dict]:
    """The members' manifests: every one finished, a different member of the same seed's split,
    data and task as the first, trained alike (``in_process``: kept in their run folders, for
    :func:`predict_ensemble`; else each predicts by its own path); with noise (tau < 1) all
    of one linkage release (one job, one service secret: trained with the same out-dir), since
    each release the primary sees is another noisy draw of the same similarities."""
    if len(run_dirs) != len(set(Path(r).resolve() for r in run_dirs)):
        raise KeptError(f"an ensemble names a run twice: {[str(r) for r in run_dirs]}")
    metas = []
    for run_dir in run_dirs:
        require_finished(Path(run_dir), kept=True)
        metas.append(read_manifest(Path(run_dir)))
        if metas[-1].get("mode", "vfl") != "vfl":
            raise KeptError(f"{run_dir} is a {metas[-1]['mode']!r} run: ensembles are of vfl runs (run-config member)")
    elsewhere = [str(r) for r, m in zip(run_dirs, metas) if m.get("secondary_states", "run") != "run"]
    if in_process and elsewhere:
        raise KeptError(
            f"{elsewhere} kept each secondary's model in that party's own folder (trained through Flower); "
            "scoring in this process reads them from the run folder: train the members with --engine "
            "inprocess, or predict with the ensemble through `fedsim predict RUN CSV --member RUN2 ...`"
        )
    first = metas[0]
    for run_dir, meta in zip(run_dirs[1:], metas[1:], strict=True):
        differ = [k for k in SHARED if meta.get(k) != first.get(k)]
        differ += [k for k in SHARED_RUN if meta["run"].get(k) != first["run"].get(k)]
        differ += [f"primary {k}" for k in SHARED_PRIMARY if meta["primary"].get(k) != first["primary"].get(k)]
        if first["run"].get("tau", 1.0) < 1.0:
            differ += [k for k in ("job_id", "out_dir") if _release(meta)[k] != _release(first)[k]]
        if differ:
            raise KeptError(
                f"ensemble member {run_dir} differs from {run_dirs[0]} in {differ}: the members of an "
                "ensemble are runs of one dataset, task and seed's split (run-config member: 0, 1, 2, ...)"
                ", kept in their run folders, and with tau < 1 of one linkage release (the same out-dir)"
            )
    members = [m["run"].get("member", 0) for m in metas]  # a run from before `member` was member 0
    if len(set(members)) != len(members):
        raise KeptError(f"an ensemble's runs must be different members (run-config member): members {members}")
    return metas


def _release(meta: dict) -> dict:
    return {"job_id": meta["job_id"], "out_dir": meta["run"].get("out_dir", "")}


def average(predictions: list[Prediction], task: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(values (q,), proba (q, C) | None) of the members' mean, as one model of ``task`` reports
    them (strategies/heads.py TaskHead.predict)."""
    if task == "regression":  # the mean value
        return np.mean([p.values for p in predictions], axis=0), None
    proba = np.mean([p.proba for p in predictions], axis=0)  # (q, C)
    values = proba[:, 1] if task == "binary" else proba.argmax(axis=1)  # binary: P(y=1); else the class
    return values, proba


def by_size(predictions: list[Prediction], head: TaskHead, y: np.ndarray) -> list[dict[str, float]]:
    """The metrics on labels ``y`` of the mean of the first 1, 2, ... ``predictions``."""
    out = []
    for n in range(1, len(predictions) + 1):
        values, proba = average(predictions[:n], head.task)
        out.append(head.metrics(values, y, proba))
    return out


def score_kept(run_dirs: list[Path], head: TaskHead) -> dict[str, list[dict[str, float]]]:
    """{"val": [metrics of the first 1, 2, ... members' mean], "test": [...]} from each member's
    kept evaluation outputs (app/kept.py read_outputs): no member predicts again, so members trained
    through Flower score as those trained in process. The members must have evaluated the same rows."""
    kept = [read_outputs(r) for r in run_dirs]
    scores: dict[str, list[dict[str, float]]] = {}
    for part in ("val", "test"):
        first = kept[0][part]
        for run_dir, k in zip(run_dirs[1:], kept[1:], strict=True):
            if not np.array_equal(k[part]["rows"], first["rows"]):
                raise KeptError(f"ensemble member {run_dir} evaluated other {part} rows than {run_dirs[0]}")
        preds = [Prediction(k[part]["values"], k[part].get("proba"), None, {}, 0, {}) for k in kept]
        scores[part] = by_size(preds, head, first["y"])
    return scores


def predict_ensemble(
    run_dirs: list[Path], features: np.ndarray, identifiers: np.ndarray, *, batch: int = 4096
) -> tuple[Prediction, list[Prediction]]:
    """(the ensemble's prediction, each member's). The ensemble's best_epoch is the first member's;
    its linkage and weights are the first member's (an explanation is per member)."""
    metas = check_members(run_dirs)
    members = [predict_in_process(r, features, identifiers, batch=batch) for r in run_dirs]
    values, proba = average(members, metas[0]["head"]["task"])
    seconds = {k: sum(m.seconds[k] for m in members) for k in members[0].seconds}
    first = members[0]
    return Prediction(values, proba, first.linkage, first.weights, first.best_epoch, seconds), members
