"""`fedsim predict RUN NEW --out P.csv`: predictions from a trained run's kept federation, by the
path the run was trained on:

- in process (the secondaries' states kept in the run folder): app/vfl/predict_csv.py;
- through `flwr run` in simulation (each secondary kept its own): the predict mode of the same
  apps (app/vfl/predict_server.py), with the training's run config plus the predict-* keys;
- on a deployment (--deployment DIR): the primary queries the linkage service, then `flwr run`
  in predict mode (deploy/predict.py);
- Entity Augmentation runs: entities named by id (app/entity_aug/predict.py; NEW holds the ids).

Exit 0 only with the output written; otherwise the reason on stderr and no output file.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import time
from pathlib import Path

from fedsim.watch import tail, watch


def add_parser(sub) -> None:
    s = sub.add_parser("predict", help="predict new records with a trained run",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s.add_argument("run_dir", type=Path, help="the trained run's folder")
    s.add_argument("new", type=Path, help="CSV of new primary records (raw columns) or .npz of prepared arrays; "
                                          "Entity Augmentation: a CSV of entity ids")
    s.add_argument("--out", type=Path, required=True, help="the predictions CSV")
    s.add_argument("--id-column", default="", help="a column of NEW naming each record ('' = row number); "
                                                   "Entity Augmentation: the entity id column")
    s.add_argument("--explain", action="store_true", help="add each record's neighbours, similarities, weights")
    s.add_argument("--unknown", choices=("ignore", "refuse"), default="ignore",
                   help="a category unseen in training: no one-hot feature set (ignore), or an error")
    s.add_argument("--deployment", type=Path, default=None, help="the `fedsim deploy up` folder it trained on")
    s.add_argument("--timeout", type=float, default=3600.0)


def _manifest(run_dir: Path) -> dict:
    from app.run_status import require_finished
    from app.kept import read_manifest

    require_finished(run_dir)
    return read_manifest(run_dir)


def command(args: argparse.Namespace) -> int:
    if args.out.resolve() == args.new.resolve():
        print("fedsim predict: --out names the input NEW", file=sys.stderr)
        return 1
    args.out.unlink(missing_ok=True)  # whatever happens, an older output cannot pass for this one
    try:
        meta = _manifest(args.run_dir)
    except Exception as e:  # noqa: BLE001 - no usable run: named
        print(f"fedsim predict: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if meta.get("mode") == "entity-aug":
        from app.entity_aug.predict import main as ea_main

        return ea_main([str(args.run_dir), "--ids", str(args.new), "--out", str(args.out),
                        *(["--ids-column", args.id_column] if args.id_column else [])])
    if meta.get("secondary_states", "run") != "parties":
        from app.vfl.predict_csv import main as in_process

        return in_process([str(args.run_dir), str(args.new), "--out", str(args.out), "--id-column", args.id_column,
                           "--unknown", args.unknown, *(["--explain"] if args.explain else [])])
    if args.deployment:
        from deploy.predict import command as deployed

        ns = argparse.Namespace(folder=args.deployment, run=args.run_dir.name, input=args.new, out=args.out,
                                id_column=args.id_column, explain=args.explain)
        return deployed(ns)
    return _simulation(meta, args)


def _simulation(meta: dict, args: argparse.Namespace) -> int:
    """`flwr run` in predict mode with the training's run config."""
    from app.config import RunConfig
    from deploy.localsim import start_simulation, stop_superlink

    run_dir, out, new = args.run_dir.resolve(), args.out.resolve(), args.new.resolve()
    trained = RunConfig(**meta["run"])
    values = {k.replace("_", "-"): v for k, v in dataclasses.asdict(trained).items()}
    values.update({"out-dir": str(run_dir.parent), "run-name": "", "resume": False, "predict-run": run_dir.name,
                   "predict-input": str(new), "predict-output": str(out), "predict-id-column": args.id_column,
                   "predict-explain": args.explain, "predict-unknown": args.unknown})
    out.unlink(missing_ok=True)
    log = run_dir / "predict-flower.log"
    home = run_dir.parent / ".flower" / f"predict-{run_dir.name}"
    with open(log, "w") as sink:
        proc, port = start_simulation(values, home, num_supernodes=len(meta["secondaries"]), output=sink)
        try:
            deadline = time.monotonic() + args.timeout
            watch(lambda: proc.poll() is not None or time.monotonic() > deadline, None, label="predict")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            stop_superlink(port)
            shutil.rmtree(home, ignore_errors=True)
    if not out.exists():
        print(f"fedsim predict: no output was written; the run's log ({log}) ends:\n{tail(log)}", file=sys.stderr)
        return 1
    print(f"predictions (best epoch {meta['best_epoch']}) -> {out}")
    return 0
