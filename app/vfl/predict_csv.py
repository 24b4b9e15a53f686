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
(a learned stand-in for "no good match"; per record the attention weights sum to 1). Exit 0 only
with the output written; bad input is refused before anything runs (exit 2), a failure after
that exits 1; the output replaces --out only when whole, so a failed predict leaves an older
file there byte-identical and says so (app/predict_files.py). --skip-invalid: the records that
cannot be predicted are left out and listed in <out stem>.skipped.csv.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from app.kept import KeptError, predict_command, read_manifest, write_csv
from app.predict_files import closing, kept_rows_input, left_note, output_refusal, run_to_output
from app.run_status import require_finished
from app.vfl.predict import Prediction, check_new, predict_in_process
from datasets.base import DatasetError
from datasets.cells import bad_rows, cell_problems, column_text, read_table, refuse_problems, row_reasons
from datasets.csv_parties import normalized_strings
from datasets.tables import read_identifiers, require_columns
from datasets.transform import FeatureTransform
from files.csv_lines import record_lines


@dataclass(frozen=True)
class NewRecords:
    """New records to predict and how to read them: the file, the column naming each record ("":
    its row number), an unseen category ignored (no one-hot feature set) or refused, and a record
    that cannot be predicted refusing the file or, with ``skip``, left out and listed."""

    path: Path
    id_column: str = ""
    unknown: str = "ignore"
    skip: bool = False


def read_new(run_dir: Path, new: NewRecords):
    """(keys (q,), features (q, d_P), identifiers, report) of the new records in ``new.path``. A
    bad cell (datasets/cells.py: a non-number in a numeric column, a missing identifier) is
    refused by its line and the record's id; with ``new.skip`` its record is left out instead and
    listed in ``report["skipped"]`` as (line, id, reason), as is (under ``unknown="refuse"``) one
    with an unseen category."""
    path, id_column, unknown, skip = new.path, new.id_column, new.unknown, new.skip
    meta = read_manifest(run_dir)
    primary = meta["primary"]
    if primary["features"] is None:
        raise KeptError(
            f"run {run_dir} (dataset {meta['dataset']!r}) recorded no feature preparation for its "
            "primary; predict from a CSV needs a run of the `csv` dataset"
        )
    transform = FeatureTransform.from_json(primary["features"])
    where = f"new records {path}"
    df = read_table(path, where, transform.numeric)
    names, kind = primary["id_names"], primary["id_kind"]
    require_columns(df, [*names, *([id_column] if id_column else [])], where)
    lines = record_lines(path, len(df))  # (q,) each record's line in the file
    keys = _id_text(path, id_column, lines, where) if id_column else np.arange(len(df))
    twice = repeated_id(keys, lines) if id_column else None  # two records' predictions under one id: whose is whose?
    if twice:
        raise DatasetError(f"{where}: {twice}")
    problems = cell_problems(df, numeric=transform.numeric, identifiers=names, id_kind=kind)
    skipped = []
    if skip:
        problems += transform.unseen(df) if unknown == "refuse" else []
        bad, reasons = bad_rows(problems, len(df)), row_reasons(problems, df)
        skipped = [(int(lines[r]), keys[r], reasons[int(r)]) for r in np.flatnonzero(bad)]
        if bad.all():
            first = f"; the first: line {skipped[0][0]}, {skipped[0][2]}" if skipped else ""
            raise DatasetError(f"{where}: none of its {len(df)} record(s) can be predicted{first}")
        df, keys = df[~bad].reset_index(drop=True), keys[~bad]
    else:
        refuse_problems(problems, df, path, "new records", keys if id_column else None, lines)
    ids = read_identifiers(normalized_strings(df, names, where) if kind == "string" else df, names, kind, where)
    features, report = transform.apply(df, where, unknown)
    return keys, features, ids, report | {"skipped": skipped}


def _id_text(path: Path, column: str, lines: np.ndarray, where: str) -> np.ndarray:
    """(q,) the records' ids as the file writes them ('007' stays '007', 'NA' stays 'NA'), read
    apart from the features (the column may be one); a blank id is refused by its line."""
    ids = column_text(path, column)  # (q,)
    blank = np.flatnonzero(np.char.strip(ids.astype(str)) == "")
    if len(blank):
        raise DatasetError(
            f"{where}: {len(blank)} record(s) without an id in column {column!r} (lines {lines[blank[:5]].tolist()})"
        )
    return ids


def repeated_id(keys, lines: np.ndarray) -> str | None:
    """What is wrong when an id names two records of a FedSim predict input (each its own
    features, so two predictions under one id could not be told apart): "id 'a' names 2 records
    (lines [2, 4]); each id once", ``lines`` (q,) each record's line in the file; None when each is once.
    Entity Augmentation's ids name entities: a repeated one gets the same prediction twice."""
    text = np.asarray(keys).astype(str)
    values, counts = np.unique(text, return_counts=True)
    if not (counts > 1).any():
        return None
    twice = str(values[counts > 1][0])
    shown = lines[np.flatnonzero(text == twice)[:5]].tolist()
    return f"id {twice!r} names {int((text == twice).sum())} records (lines {shown}); each id once"


def read_arrays(path: Path, id_column: str = ""):
    """(keys, features (q, d_P), identifiers, report) from an .npz of prepared arrays: ``features``
    as the loader prepared the primary's (built-in datasets), ``identifiers``, and optionally
    the ``id_column`` array naming each record. No other array is accepted."""
    with np.load(path, allow_pickle=False) as z:
        names = set(z.files)
        allowed = {"features", "identifiers", *([id_column] if id_column else [])}
        if not {"features", "identifiers"} <= names or names - allowed:
            raise KeptError(
                f"new records {path}: an .npz of prepared arrays holds 'features' and 'identifiers'"
                f"{f' and {id_column!r}' if id_column else ''}; it has {sorted(names)}"
            )
        keys = z[id_column] if id_column else np.arange(len(z["features"]))
        return keys, z["features"], z["identifiers"], {}


def read_input(run_dir: Path, new: NewRecords):
    """New records from a CSV of raw columns (:func:`read_new`) or an .npz of prepared arrays."""
    if not Path(new.path).exists():
        raise KeptError(f"new records: no file at {Path(new.path).resolve()}")
    if Path(new.path).suffix == ".npz":
        return read_arrays(new.path, new.id_column)
    return read_new(run_dir, new)


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


def flower_predict(
    run_dir: Path, new: NewRecords, out: Path, *, start: Callable[[Path, Path, str], bool], who: str
) -> int:
    """A predict whose run reads its input itself (``start(input, partial output, id column)``,
    through `flwr run`): the input is read and checked here first, as that run will read it (exit
    2, nothing started), without the skipped records when ``new.skip``; then :func:`run_to_output`."""
    made = None
    try:
        refused = output_refusal(out, new.path)
        if refused:
            raise ValueError(refused)
        meta = read_manifest(run_dir)
        keys, features, ids, report = read_input(run_dir, new)
        check_new(features, ids, meta)
        run_input, run_id_column = Path(new.path).resolve(), new.id_column
        if report.get("skipped"):
            made, run_id_column = kept_rows_input(new.path, report["skipped"], new.id_column, Path(out).resolve())
            run_input = made
    except Exception as exc:  # bad input: named, and nothing started
        print(f"{who}: {type(exc).__name__}: {exc}{left_note(out)}", file=sys.stderr)
        return 2
    try:
        code = run_to_output(out, lambda partial: start(run_input, partial, run_id_column))
    finally:
        if made is not None:
            made.unlink(missing_ok=True)
    if code == 0:
        print(closing(out, len(keys), meta["best_epoch"], report, new.skip, new.id_column))
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("new", type=Path, help="CSV of new primary records (or an .npz of prepared arrays)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--id-column", default="", help="a column of NEW.csv to name each record by")
    ap.add_argument("--explain", action="store_true", help="add each record's neighbours, similarities, weights")
    ap.add_argument(
        "--unknown",
        choices=("ignore", "refuse"),
        default="ignore",
        help="a category not seen in training: no one-hot feature set (ignore), or an error",
    )
    ap.add_argument(
        "--skip-invalid",
        action="store_true",
        help="leave out the records that cannot be predicted and list them in <out stem>.skipped.csv",
    )
    args = ap.parse_args(argv)

    def check() -> None:
        require_finished(args.run_dir, kept=True)
        read_manifest(args.run_dir)

    def read():
        return read_input(args.run_dir, NewRecords(args.new, args.id_column, args.unknown, args.skip_invalid))

    def predict(data) -> str:
        keys, features, ids, report = data
        pred = predict_in_process(args.run_dir, features, ids, explain=args.explain)
        write_csv(table(keys, args.id_column, pred, args.explain), args.out)
        return closing(args.out, len(keys), pred.best_epoch, report, args.skip_invalid, args.id_column)

    return predict_command(args.out, args.new, predict, read, check)


if __name__ == "__main__":
    sys.exit(main())
