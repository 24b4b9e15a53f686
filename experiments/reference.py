"""The non-federated reference row of the results tables: gradient boosting on the primary's
features plus the mean features of its K nearest linked records of each secondary, on the same
splits and linkage as the federated runs (one pooled table, which no federation may build).

    python -m experiments.reference game --seeds 0 1 2 3 4 [-c n-rows=60000 -c sigma-cf=0.2]
        [--learning-rate 0.1 --max-iter 1000]

K (from 1, 5, 10 and the dataset's FedSim K) and the number of boosting iterations are chosen
on the validation split; the test metric is reported at that choice only. Prints one line per
seed and the mean ± std, and appends the rows to runs/reference/<dataset>.csv.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

from app.config import RunConfig, parse_pairs
from app.data import load_data
from app.vfl.linking import run_linkage
from experiments.runner import REPO
from strategies.heads import TaskHead

KS = (1, 5, 10)
MAX_ITER, LEARNING_RATE = 1000, 0.1


def neighbour_means(ds, cfg: RunConfig) -> dict[int, np.ndarray]:
    """{K: (m, sum of d_S) the mean features of each record's K most similar linked records}."""
    settings = cfg.resolve()
    result = run_linkage(ds, cfg, settings)
    means: dict[int, list[np.ndarray]] = {}
    for party, link in sorted(result.primary.links.items()):
        rows = result.secondaries[party].row_of_token[link.tokens]  # (m, K), most similar first
        feats = ds.secondaries[party].features  # (n, d_S)
        for k in sorted({*KS, settings.k}):
            if k <= rows.shape[1]:
                means.setdefault(k, []).append(feats[rows[:, :k]].mean(axis=1))  # (m, d_S)
    return {k: np.hstack(v) for k, v in means.items()}


def boost(task: str, seed: int, max_iter: int = MAX_ITER, learning_rate: float = LEARNING_RATE, stop_after: int = 0):
    """Gradient boosting; ``stop_after`` > 0: stop once the validation loss (fit's X_val) has not
    improved for that many iterations (bounds the time; validation only ever chooses)."""
    kind = HistGradientBoostingRegressor if task == "regression" else HistGradientBoostingClassifier
    return kind(
        max_iter=max_iter,
        learning_rate=learning_rate,
        early_stopping=stop_after > 0,
        n_iter_no_change=max(stop_after, 1),
        random_state=seed,
    )


def fit_best(ds, head: TaskHead, x: np.ndarray, seed: int, boosting: tuple = (MAX_ITER, LEARNING_RATE, 0)):
    """(val metric, test prediction, iterations) at the boosting iteration best on validation;
    ``boosting``: (max_iter, learning_rate, stop_after). The test rows never choose."""
    sp, y = ds.split, ds.labels
    model = boost(ds.task, seed, *boosting)
    stopping = {"X_val": x[sp.val], "y_val": y[sp.val]} if boosting[2] > 0 else {}
    model.fit(x[sp.train], y[sp.train], **stopping)
    stages = model.staged_predict_proba if ds.task != "regression" else model.staged_predict
    best = (None, -1)
    for i, pred in enumerate(stages(x[sp.val])):
        value = head.metrics(_as_prediction(ds.task, pred), y[sp.val])[head.key_metric]
        if best[0] is None or head.better(value, best[0]):
            best = (value, i)
    test = _as_prediction(ds.task, list(stages(x[sp.test]))[best[1]])
    return best[0], test, best[1] + 1


def fit_one(
    ds, head: TaskHead, x: np.ndarray, seed: int, max_iter: int, learning_rate: float
) -> tuple[float, float, int]:
    """(val, test) metric at the boosting iteration that is best on validation, and that iteration."""
    val, test, iters = fit_best(ds, head, x, seed, (max_iter, learning_rate, 0))
    return val, head.metrics(test, ds.labels[ds.split.test])[head.key_metric], iters


def _as_prediction(task: str, out: np.ndarray) -> np.ndarray:
    if task == "binary":
        return out[:, 1]  # P(y = 1): TaskHead.metrics thresholds at 0.5
    if task == "multiclass":
        return out.argmax(axis=1)
    return out


def reference(cfg: RunConfig, max_iter: int = MAX_ITER, learning_rate: float = LEARNING_RATE) -> dict:
    """The reference for one seed: K and iterations chosen on validation."""
    t0 = time.monotonic()
    ds = load_data(cfg)
    head = TaskHead.fit(ds.task, ds.labels[ds.split.train], ds.n_classes)
    best = None
    for k, means in neighbour_means(ds, cfg).items():
        val, test, iters = fit_one(
            ds, head, np.hstack([ds.primary.features, means]), cfg.train.seed, max_iter, learning_rate
        )
        if best is None or head.better(val, best["val"]):
            best = {"k": k, "val": val, "test": test, "iterations": iters}
    return {
        "dataset": ds.name,
        "seed": cfg.train.seed,
        "metric": head.key_metric,
        **best,
        "seconds": round(time.monotonic() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m experiments.reference",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("dataset")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--max-iter", type=int, default=MAX_ITER, help=f"boosting iterations at most ({MAX_ITER})")
    ap.add_argument("--learning-rate", type=float, default=LEARNING_RATE, help=f"boosting rate ({LEARNING_RATE})")
    ap.add_argument("--out", type=Path, default=None, help="the CSV the rows are appended to (runs/reference/D.csv)")
    ap.add_argument(
        "-c",
        dest="values",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a run-config value (n-rows, sigma-cf, ...), as in the sweep files",
    )
    args = ap.parse_args(argv)
    base = RunConfig.from_flower({"dataset": args.dataset, **parse_pairs(args.values)})
    rows = []
    for seed in args.seeds:
        row = reference(base.replace(seed=seed), args.max_iter, args.learning_rate)
        print(
            f"{row['dataset']} seed {seed}: K={row['k']} iterations={row['iterations']} "
            f"val {row['metric']} {row['val']:.4f} test {row['test']:.4f} ({row['seconds']} s)",
            flush=True,
        )
        rows.append(
            {**row, "config": " ".join(args.values), "max_iter": args.max_iter, "learning_rate": args.learning_rate}
        )
    tests = [r["test"] for r in rows]
    print(
        f"{args.dataset} gradient boosting reference: test {rows[0]['metric']} {statistics.mean(tests):.4f}"
        f" ± {statistics.stdev(tests) if len(tests) > 1 else 0.0:.4f} over {len(tests)} seeds"
    )
    _append(args.out or REPO / "runs" / "reference" / f"{args.dataset}.csv", rows)
    return 0


def _append(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    raise SystemExit(main())
