"""Predict from a CSV of new primary records into a CSV, with a kept federation in process.

    python -m app.vfl.predict_csv RUN_DIR NEW.csv --out predictions.csv [--id-column id]
                                  [--explain] [--unknown ignore|refuse]

NEW.csv holds the primary's raw columns as in training: its identifier columns and the feature
columns its recorded preparation names (federation.json; runs of the `csv` dataset record it).
The output has the id column (or `row`, the input's row number), `prediction` (regression: the
label's units; classification: the class) and, for classification, `p_<class>` probabilities;
with --explain, per secondary and neighbour k = 1..K the opaque `token`, the noisy standardised
`similarity` and the `weight` the paper's weight gate gave it; with method fedsim_attn also the
`attention` weight of the improved model's branch on it, and `attention_null` on the null slot
(a learned stand-in for "no good match"; per record the attention weights sum to 1). Exit 0 only with the output written; on any
error, the reason on stderr, exit 1, and no output file at --out (an older one is removed, so
it cannot pass for this run's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from app.kept import KeptError, predict_command, read_manifest, write_csv
from app.vfl.predict import Prediction, predict_in_process
from datasets.csv_parties import normalized_strings
from datasets.tables import read_identifiers, require_columns
from datasets.transform import FeatureTransform


def read_new(run_dir: Path, path: Path, id_column: str = "", unknown: str = "ignore"):
    """(keys (q,), features (q, d_P), identifiers, report) of the new records in ``path``."""
    meta = read_manifest(run_dir)
    primary = meta["primary"]
    if primary["features"] is None:
        raise KeptError(f"run {run_dir} (dataset {meta['dataset']!r}) recorded no feature preparation for its "
                        "primary; predict from a CSV needs a run of the `csv` dataset")
    transform = FeatureTransform.from_json(primary["features"])
    df = pd.read_csv(path)
    where = f"new records {path}"
    require_columns(df, [*primary["id_names"], *([id_column] if id_column else [])], where)
    names, kind = primary["id_names"], primary["id_kind"]
    ids = read_identifiers(normalized_strings(df, names, where) if kind == "string" else df, names, kind, where)
    features, report = transform.apply(df, where, unknown)
    keys = df[id_column].to_numpy() if id_column else np.arange(len(df))
    return keys, features, ids, report


def read_arrays(path: Path, id_column: str = ""):
    """(keys, features (q, d_P), identifiers, report) from an .npz of prepared arrays: ``features``
    as the loader prepared the primary's (built-in datasets), ``identifiers``, and optionally
    the ``id_column`` array naming each record. No other array is accepted."""
    with np.load(path, allow_pickle=False) as z:
        names = set(z.files)
        allowed = {"features", "identifiers", *([id_column] if id_column else [])}
        if not {"features", "identifiers"} <= names or names - allowed:
            raise KeptError(f"new records {path}: an .npz of prepared arrays holds 'features' and 'identifiers'"
                            f"{f' and {id_column!r}' if id_column else ''}; it has {sorted(names)}")
        keys = z[id_column] if id_column else np.arange(len(z["features"]))
        return keys, z["features"], z["identifiers"], {}


def read_input(run_dir: Path, path: Path, id_column: str = "", unknown: str = "ignore"):
    """New records from a CSV of raw columns (:func:`read_new`) or an .npz of prepared arrays."""
    if not Path(path).exists():
        raise KeptError(f"new records: no file at {Path(path).resolve()}")
    if Path(path).suffix == ".npz":
        return read_arrays(path, id_column)
    return read_new(run_dir, path, id_column, unknown)


def table(keys: np.ndarray, id_column: str, pred: Prediction, explain: bool) -> pd.DataFrame:
    cols = {id_column or "row": keys}
    if pred.proba is None:
        cols["prediction"] = pred.values
    else:
        cols["prediction"] = pred.proba.argmax(axis=1)
        cols |= {f"p_{c}": pred.proba[:, c] for c in range(pred.proba.shape[1])}
    if explain and pred.linkage is not None:
        for party, link in sorted(pred.linkage.links.items()):
            for k in range(link.tokens.shape[1]):
                cols[f"{party}_token_{k + 1}"] = link.tokens[:, k]
                cols[f"{party}_similarity_{k + 1}"] = link.sims[:, k]
                cols[f"{party}_weight_{k + 1}"] = pred.weights[party][:, k]
                if party in pred.attention:
                    cols[f"{party}_attention_{k + 1}"] = pred.attention[party][:, k]
            if party in pred.attention:
                cols[f"{party}_attention_null"] = pred.attention[party][:, -1]
    return pd.DataFrame(cols)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("new", type=Path, help="CSV of new primary records (or an .npz of prepared arrays)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--id-column", default="", help="a column of NEW.csv to name each record by")
    ap.add_argument("--explain", action="store_true", help="add each record's neighbours, similarities, weights")
    ap.add_argument("--unknown", choices=("ignore", "refuse"), default="ignore",
                    help="a category not seen in training: no one-hot feature set (ignore), or an error")
    args = ap.parse_args(argv)

    def predict() -> str:
        keys, features, ids, report = read_input(args.run_dir, args.new, args.id_column, args.unknown)
        pred = predict_in_process(args.run_dir, features, ids, explain=args.explain)
        write_csv(table(keys, args.id_column, pred, args.explain), args.out)
        for what, counts in report.items():
            if counts:
                print(f"note: {what.replace('_', ' ')}: {counts}", file=sys.stderr)
        return f"{len(keys)} predictions (best epoch {pred.best_epoch}) -> {args.out}"

    return predict_command(args.out, args.new, "NEW.csv", predict)


if __name__ == "__main__":
    sys.exit(main())
