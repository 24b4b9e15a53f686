"""Predict with a run trained on the local deployment (TLS + node auth):

    python -m deploy predict DIR --run NAME --input new.csv --out predictions.csv [--id-column id] [--explain]

The primary reads its new records (a CSV of its raw columns, or an .npz of prepared arrays),
queries the linkage service for them with its own party secret (kept by `deploy link` in its
own folder; the service links them in the job's regime: app/vfl/predict_server.py), keeps the
answer in its own folder, and runs `flwr run` in predict mode: each SuperNode embeds its tokens
with the model it kept for the run in its own model folder. Exit 0 only with the output
written; bad input is refused before the query (exit 2), a failure after it exits 1, and the
output replaces --out only when whole: an older file there is left byte-identical on failure.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from deploy.commands import PRIMARY, SECRET, Deployment, flwr_run


def query(dep: Deployment, run: str, new: Path, id_column: str = "") -> Path:
    """The service's answer for the new records, in the primary's folder (queries/<run>.npz)."""
    from app.vfl.predict_csv import NewRecords, read_input  # lazy: torch, flwr and pandas, when a deployment predicts
    from linkage_server.client import LinkageClient  # lazy: httpx and scipy, when a deployment predicts

    _, _, ids, _ = read_input(dep.root / "runs" / run, NewRecords(new, id_column))
    secret_file = dep.party_dir(PRIMARY) / SECRET
    if not secret_file.exists():
        raise SystemExit(f"no primary secret at {secret_file}: link with `python -m deploy link {dep.folder}` first")
    from deploy.private_mode import as_uploaded, party_key  # lazy: the encoders, when a deployment predicts
    from linkage.binding import write_query_record  # lazy: with the encoders, when a deployment predicts

    answer = dep.party_dir(PRIMARY) / "queries" / f"{run}.npz"
    sent, _, fingerprint = as_uploaded(party_key(dep, PRIMARY), ids)  # encoded as training's upload was
    with LinkageClient(dep.service_url, dep.job, PRIMARY, secret_file.read_text().strip(), verify=dep.verify) as c:
        c.query(sent, fingerprint=fingerprint, out=answer)
    write_query_record(answer, sent, ids)  # binds the answer to the raw records predict reads
    return answer


def predict(
    dep: Deployment,
    run: str,
    new: Path,
    out: Path,
    *,
    id_column: str = "",
    explain: bool = False,
    timeout: float = 900.0,
) -> subprocess.CompletedProcess:
    """Query, then `flwr run` in predict mode; the caller checks ``out`` (a fresh name: command)."""
    new, out = Path(new).resolve(), Path(out).resolve()
    answer = query(dep, run, new, id_column)
    return flwr_run(
        dep, {**trained_values(dep, run), **predict_values(run, new, out, answer, id_column, explain)}, timeout
    )


def trained_values(dep: Deployment, run: str) -> dict:
    """The run config the run was trained with (its kept manifest), as predict mode needs it:
    the parties, method and model it was trained with, not the deployment's defaults."""
    from app.kept import read_manifest, trained_values  # lazy: torch, when a deployment predicts

    values = trained_values(read_manifest(dep.root / "runs" / run))
    for key in ("out-dir", "run-name", "resume", "linkage-dir", "data-dir", "dataset"):
        values.pop(key, None)  # the deployment's own folders and data
    return values


def predict_values(run: str, new: Path, out: Path, answer: Path, id_column: str = "", explain: bool = False) -> dict:
    """The run-config keys of a deployed predict run (``answer``: the service's links for ``new``)."""
    return {
        "run-name": "",
        "predict-run": run,
        "predict-input": str(new),
        "predict-output": str(out),
        "predict-linkage": str(answer),
        "predict-id-column": id_column,
        "predict-explain": explain,
    }


def add_parser(sub) -> None:
    s = sub.add_parser("predict", help="predict new records with a run trained on the deployment")
    s.add_argument("folder", type=Path)
    s.add_argument("--run", required=True, help="the trained run's name (its folder under DIR/runs)")
    s.add_argument("--input", type=Path, required=True, help="CSV of new primary records (or .npz of arrays)")
    s.add_argument("--out", type=Path, required=True, help="the predictions CSV")
    s.add_argument("--id-column", default="", help="a column of the input naming each record ('' = row number)")
    s.add_argument("--explain", action="store_true", help="add each record's neighbours, similarities, weights")
    s.add_argument(
        "--skip-invalid",
        action="store_true",
        help="predict the records it can; list the others in <out stem>.skipped.csv",
    )


def command(args: argparse.Namespace) -> int:
    """The input checked before the query and `flwr run` (exit 2); the output replaces --out only
    when whole (app/predict_files.py)."""
    from app.vfl.predict_csv import NewRecords, flower_predict  # lazy: torch, flwr, pandas; a deployment's predict

    try:
        dep = Deployment.load(args.folder)
    except Exception as exc:  # the outcome is the exit status, with the reason
        print(f"predict failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1

    def start(new: Path, partial: Path, id_column: str) -> bool:
        try:
            r = predict(dep, args.run, new, partial, id_column=id_column, explain=args.explain)
        except Exception as exc:  # the outcome is the exit status, with the reason
            print(f"predict failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return False
        if not partial.exists():
            print(
                f"predict failed: the run wrote no output; its log ends:\n{(r.stdout + r.stderr)[-4000:]}",
                file=sys.stderr,
            )
        return partial.exists()

    new = NewRecords(args.input, args.id_column, "ignore", getattr(args, "skip_invalid", False))
    return flower_predict(dep.root / "runs" / args.run, new, args.out, start=start, who="predict refused")
