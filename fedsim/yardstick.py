"""The yardstick beside every run `fedsim train` finishes: on the run's own split (its split.csv),
what the primary would get alone and what pooling every party's data would give, next to the
federated model's test metric, with a plain verdict.

- **primary alone**: gradient boosting on the primary's own features, and (mode vfl, every
  party's data here) the neural model on them alone (method solo, trained in process on the same
  split: :func:`neural_alone`); the verdict is against whichever of the two validates better;
- **pooled reference**: gradient boosting on the primary's features and, per secondary, the mean
  features of its K most similar linked records (FedSim's linkage; K from 1, 5, 10 and the run's)
  or, in Entity Augmentation, the features of the same entity's record (missing where a party
  holds none). A table no federation may build: where the parties' data are on their own hosts
  (a deployment, or a primary that reads only its own file) it is not computed, and says why.

Boosting's iterations and the pooled K are chosen on the validation rows; the test rows never
choose. Each test metric comes with its sampling error over the test rows (the standard deviation
of the metric over bootstrap resamples of them); the verdict calls the federated model ahead or
behind the primary alone only when the gap is more than twice the error of a difference of two
such metrics (sqrt(2) x the primary-alone's error: the federated model's own predictions per row
are not kept, so the pairing that would shrink it is not used; a conservative call). Written to
the run's yardstick.json and printed; `fedsim report` shows it.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from app.run_files import YARDSTICK as FILE
from experiments.reference import fit_best, neighbour_means
from fedsim.ensemble_step import federated as ensemble_test
from files.atomic import write_atomic
from strategies.heads import LOWER_IS_BETTER, TaskHead, better

RESAMPLES = 200  # bootstrap resamples of the test rows: the error of a ~0.1 x error estimate, enough to call a gap
STOP_AFTER = 50  # boosting stops once validation loss has not improved for this many iterations (bounds the time)


def run_split(ds, run_dir: Path):
    """``ds`` with the split the run wrote (split.csv), so every number is on the run's own rows."""
    import pandas as pd  # lazy: pandas only where a yardstick is computed

    from datasets.base import Split  # lazy: the loaders' types, with pandas

    table = pd.read_csv(run_dir / "split.csv")
    rows = {p: table.loc[table["part"] == p, "row"].to_numpy() for p in ("train", "val", "test")}
    return replace(ds, split=Split(rows["train"], rows["val"], rows["test"]))


def sampling_error(head, pred: np.ndarray, y: np.ndarray, seed: int) -> float:
    """The standard deviation of the key metric over bootstrap resamples of the test rows."""
    rng = np.random.default_rng(seed)
    values = [
        head.metrics(pred[idx], y[idx])[head.key_metric]
        for idx in (rng.integers(0, len(y), len(y)) for _ in range(RESAMPLES))
    ]
    return float(np.std(values))


def score(ds, head, x: np.ndarray, seed: int) -> dict:
    """One boosted model on ``x`` (m, d): its val and test metric, test error, iterations."""
    val, pred, iters = fit_best(ds, head, x, seed, (1000, 0.1, STOP_AFTER))
    y = ds.labels[ds.split.test]
    test = head.metrics(pred, y)[head.key_metric]
    return {"val": val, "test": test, "error": sampling_error(head, pred, y, seed), "iterations": iters}


def pooled(ds, cfg, head) -> dict:
    """FedSim's pooled reference, K chosen on validation (Entity Augmentation's: :func:`ea_tables`)."""
    seed = cfg.train.seed
    best = None
    for k, means in neighbour_means(ds, cfg).items():
        row = {**score(ds, head, np.hstack([ds.primary.features, means]), seed), "joined": f"top-{k} mean"}
        if best is None or head.better(row["val"], best["val"]):
            best = row
    return best


NOISE = "the test rows' noise on a difference: 2.8 x the primary alone's ±"  # 2 sqrt(2): module docstring


def verdict(head, federated: float, alone: dict) -> str:
    """Ahead / behind / level against the primary alone, at twice a difference's sampling error."""
    margin = 2 * math.sqrt(2) * alone["error"]
    gain = (federated - alone["test"]) * (1 if head.better(1.0, 0.0) else -1)  # > 0: federated is better
    if gain > margin:
        return f"federating helps: {abs(gain):.4g} better than the primary alone (more than {margin:.4g}, {NOISE})"
    if gain < -margin:
        return f"federating does not pay here: {abs(gain):.4g} worse than the primary alone (more than {margin:.4g}, {NOISE})"
    return f"level with the primary alone: the gap {gain:+.4g} is within {margin:.4g} ({NOISE})"


def constant(ds, head) -> dict:
    """A primary with no features of its own: alone it has only the training labels' constant."""
    y_train, y = ds.labels[ds.split.train], ds.labels[ds.split.test]
    # the mean: regression's value, binary's P(y = 1); multiclass: the most frequent class
    value = float(np.bincount(y_train).argmax()) if ds.task == "multiclass" else float(np.mean(y_train))
    pred = np.full(len(y), value)
    return {
        "test": head.metrics(pred, y)[head.key_metric],
        "error": sampling_error(head, pred, y, 0),
        "model": "constant",
    }


def ea_tables(cfg, data) -> tuple[np.ndarray | None, np.ndarray]:
    """Entity Augmentation: (the primary's own block or None, every block pooled), a party's
    training entities only those it iterates in the run's variant, others NaN (boosting's missing)."""
    from app.entity_aug.parties import overlap_parts  # lazy: the EA stack only for its mode
    from datasets.overlap import PRIMARY_BLOCK  # lazy: pandas, with the EA stack
    from strategies.entity_aug.model import party_records  # lazy: torch, with the EA stack

    aligned, shares = overlap_parts(cfg, data)
    records = party_records(cfg.ea.variant, data.parties, data.split.train, aligned, shares)
    blocks = []
    for party in data.parties:
        block = data.blocks[party].astype(np.float64)  # (n, d_p)
        hidden = np.zeros(len(block), dtype=bool)
        hidden[data.split.train] = True
        hidden[records.get(party, data.split.train)] = False
        if data.held is not None and party in data.held:
            hidden |= ~data.held[party]
        block[hidden] = np.nan
        blocks.append(block)
    own = data.blocks.get(PRIMARY_BLOCK)
    return (None if own is None else own.astype(np.float64)), np.hstack(blocks)


def neural_alone(values: dict, run_dir: Path) -> dict | None:
    """The primary's own features through the run's neural model alone (method solo), trained in
    this process beside the run on its split; only its summary's metrics are kept. None (said on
    stderr) when it fails: the rest of the yardstick stands without it."""
    from fedsim.search_step import train_in_process  # lazy: the training stack
    from files.private import private_dir  # lazy: as above

    folder = private_dir(run_dir / "yardstick-solo")
    name = f"{run_dir.name}.solo"
    try:
        train_in_process({**values, "method": "solo", "run-name": name, "out-dir": str(folder)}, folder / name)
        summary = json.loads((folder / name / "summary.json").read_text())
    except Exception as e:  # noqa: BLE001 - named; the boosted primary-alone still stands
        print(f"warning: the neural primary-alone was not trained: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"val": summary["val"], "test": summary["test"], "model": "neural (method solo)"}


def measure(cfg, run_dir: Path, pooled_why: str = "", neural: dict | None = None) -> dict:
    """The yardstick of a finished run (its summary.json and split.csv); ``pooled_why`` non-empty:
    the pooled reference is not computed, for that reason; ``neural``: :func:`neural_alone`'s."""
    from threadpoolctl import threadpool_limits  # lazy: only where a yardstick is computed

    t0 = time.monotonic()
    summary = json.loads((run_dir / "summary.json").read_text())
    with threadpool_limits(limits=max(cfg.runtime.threads, 1)):  # one thread unless the run said: a bounded cost
        ds, x_alone, x_pooled = _tables(cfg, run_dir, pooled_why)
        head = TaskHead.fit(ds.task, ds.labels[ds.split.train], ds.n_classes)
        alone = (
            constant(ds, head) if x_alone is None else {**score(ds, head, x_alone, cfg.train.seed), "model": "boosting"}
        )
        ref = None
        if not pooled_why:
            ref = (
                pooled(ds, cfg, head)
                if x_pooled is None
                else {**score(ds, head, x_pooled, cfg.train.seed), "joined": "entity"}
            )
    key = head.key_metric
    federated, model = ensemble_test(run_dir, key) or (summary["test"][key], "this run")  # a kept ensemble's mean
    against = alone
    if neural is not None:
        neural = {"val": neural["val"][key], "test": neural["test"][key], "model": neural["model"]}
        if "val" in alone and head.better(neural["val"], alone["val"]):  # chosen on validation, as everywhere
            against = {**neural, "error": alone["error"]}  # its own per-row predictions are not kept
    return {
        "metric": key,
        "test_rows": int(len(ds.split.test)),
        "federated": federated,
        "federated_model": model,
        "primary_alone": alone,
        **({"primary_alone_neural": neural} if neural is not None else {}),
        "pooled": ref if ref is not None else {"not_computed": pooled_why},
        "verdict": verdict(head, federated, against),
        "seconds": round(time.monotonic() - t0, 1),
    }


def _tables(cfg, run_dir: Path, pooled_why: str):
    """(the run's data on its own split, the primary-alone table or None, the pooled table or None:
    FedSim's pooled table is built from the linkage by :func:`pooled`)."""
    if cfg.train.mode == "entity-aug":
        from app.entity_aug.parties import ea_data  # lazy: the EA stack only for its mode

        data = run_split(ea_data(cfg), run_dir)
        own, pooled_table = ea_tables(cfg, data)
        return data, own, pooled_table
    from app.data import load_data, primary_data  # lazy: torch and the loaders

    ds = run_split(primary_data(cfg) if pooled_why else load_data(cfg), run_dir)
    return ds, ds.primary.features.astype(np.float64), None


def lines(y: dict) -> list[str]:
    """The yardstick as the terminal and `fedsim report` show it."""
    m, alone, ref = y["metric"], y["primary_alone"], y["pooled"]
    what = (
        "gradient boosting on its own features" if alone.get("model") == "boosting" else "the training labels' constant"
    )
    out = [
        f"yardstick on the run's {y['test_rows']} test rows (test {m}, ± its sampling error):",
        f"  federated ({y.get('federated_model', 'this run')})   {y['federated']:.4f}",
        f"  primary alone          {alone['test']:.4f} ± {alone['error']:.4f}  ({what})",
    ]
    if "primary_alone_neural" in y:
        out.append(
            f"  primary alone, neural  {y['primary_alone_neural']['test']:.4f}  (the run's model on its own features)"
        )
    if "not_computed" in ref:
        out.append(f"  pooled reference       not computed: {ref['not_computed']}")
    else:
        out.append(
            f"  pooled reference       {ref['test']:.4f} ± {ref['error']:.4f}  (boosting, {ref['joined']} features pooled)"
        )
        margin = -ref["error"] if m in LOWER_IS_BETTER else ref["error"]  # ahead by more than its error
        if better(y["federated"], ref["test"] + margin, m):
            out.append(POOLED_NOT_A_CEILING)
    return [*out, f"  verdict: {y['verdict']}"]


# said where the run beats the pooled reference by more than the reference's error (a reader took it for an error)
POOLED_NOT_A_CEILING = (
    "  (the pooled reference is one boosting model on each record's neighbours' features averaged, "
    "not a ceiling: a model that weighs each neighbour, as this run's does, can beat it)"
)


def write(run_dir: Path, y: dict) -> None:
    write_atomic(run_dir / FILE, json.dumps(y, indent=2).encode())
