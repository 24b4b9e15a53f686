"""`fedsim predict RUN NEW --out P.csv`: predictions from a trained run's kept federation, by the
path the run was trained on:

- in process (the secondaries' states kept in the run folder): app/vfl/predict_csv.py;
- through `flwr run` in simulation (each secondary kept its own): the predict mode of the same
  apps (app/vfl/predict_server.py), with the training's run config plus the predict-* keys;
- on a deployment (--deployment DIR): the primary queries the linkage service, then `flwr run`
  in predict mode (deploy/predict.py);
- Entity Augmentation runs: entities named by id (NEW holds the ids), in process
  (app/entity_aug/predict.py) or, for a run trained through `flwr run` (each guest kept its own
  state), through `flwr run` in predict mode (fedsim/predict_ea.py, app/entity_aug/predict_server.py).

Exit 0 only with the output written. Bad input is refused here, before any Flower process
starts: exit 2, one line; a failed run: exit 1. The output replaces --out only when whole, so a
failed predict leaves an older --out byte-identical and says so (app/predict_files.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedsim.helpfmt import HelpFormatter


def add_parser(sub) -> None:
    s = sub.add_parser("predict", help="predict new records with a trained run",
                       formatter_class=HelpFormatter)
    s.add_argument("run_dir", type=Path, help="the trained run's folder")
    s.add_argument("new", type=Path, help="CSV of new primary records (raw columns) or .npz of prepared arrays; "
                                          "Entity Augmentation: a CSV of entity ids")
    s.add_argument("--out", type=Path, required=True, help="the predictions CSV")
    s.add_argument("--id-column", default="", help="a column of NEW naming each record ('' = row number); "
                                                   "Entity Augmentation: the entity id column")
    s.add_argument("--explain", action="store_true", help="add each record's neighbours, similarities, weights")
    s.add_argument("--unknown", choices=("ignore", "refuse"), default="ignore",
                   help="a category unseen in training: no one-hot feature set (ignore), or an error")
    s.add_argument("--skip-invalid", action="store_true",
                   help="predict the records it can; the others (a non-number in a numeric column, a missing "
                        "identifier, with --unknown refuse an unseen category) are counted on stderr and listed "
                        "in <out stem>.skipped.csv (line, id, reason); exit 0 only if one was predicted")
    s.add_argument("--deployment", type=Path, default=None, help="the `fedsim deploy up` folder it trained on")
    s.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds before a prediction through `flwr run` (a run trained in simulation) is stopped")


def _manifest(run_dir: Path) -> dict:
    from app.kept import read_manifest
    from app.run_status import require_finished

    require_finished(run_dir)
    return read_manifest(run_dir)


def command(args: argparse.Namespace) -> int:
    if args.out.resolve() == args.new.resolve():
        print("fedsim predict: --out names the input NEW", file=sys.stderr)
        return 2
    from linkage.source_tree import inside_source

    if inside_source(args.out):
        print(f"fedsim predict: --out {args.out}: {inside_source(args.out)}; write predictions into a work folder "
              "outside the source (git ignores work/ and runs/)", file=sys.stderr)
        return 2
    try:
        meta = _manifest(args.run_dir)
    except Exception as e:  # noqa: BLE001 - no usable run: named
        from app.predict_files import left_note

        print(f"fedsim predict: {type(e).__name__}: {e}{left_note(args.out)}", file=sys.stderr)
        return 1
    if meta.get("mode") == "entity-aug":
        if meta.get("guest_states") == "guests":  # trained through `flwr run`: each guest kept its own state
            from fedsim.predict_ea import fedsim_predict

            return fedsim_predict(meta, args)
        from app.entity_aug.predict import main as ea_main

        return ea_main([str(args.run_dir), "--ids", str(args.new), "--out", str(args.out),
                        *(["--ids-column", args.id_column] if args.id_column else []),
                        *(["--skip-invalid"] if args.skip_invalid else [])])
    if meta.get("secondary_states", "run") != "parties":
        from app.vfl.predict_csv import main as in_process

        return in_process([str(args.run_dir), str(args.new), "--out", str(args.out), "--id-column", args.id_column,
                           "--unknown", args.unknown, *(["--explain"] if args.explain else []),
                           *(["--skip-invalid"] if args.skip_invalid else [])])
    if args.deployment:
        from deploy.predict import command as deployed

        ns = argparse.Namespace(folder=args.deployment, run=args.run_dir.name, input=args.new, out=args.out,
                                id_column=args.id_column, explain=args.explain, skip_invalid=args.skip_invalid)
        return deployed(ns)
    from app.vfl.predict_csv import flower_predict  # the input checked here first, the output replaced when whole

    return flower_predict(args.run_dir, args.new, args.out, id_column=args.id_column, unknown=args.unknown,
                          skip=args.skip_invalid, who="fedsim predict",
                          start=lambda new, partial, id_column: _simulation(meta, args, new, partial, id_column))


def _simulation(meta: dict, args: argparse.Namespace, new: Path, out: Path, id_column: str) -> bool:
    """`flwr run` in predict mode with the training's run config, reading ``new`` and writing
    ``out``; True when it wrote ``out``."""
    from fedsim.predict_flower import predict_through_flower

    keys = {"predict-input": str(new), "predict-output": str(out), "predict-id-column": id_column,
            "predict-explain": args.explain, "predict-unknown": args.unknown}
    return predict_through_flower(args.run_dir, meta, keys, len(meta["secondaries"]), args.timeout, out)
