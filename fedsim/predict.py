"""`fedsim predict RUN NEW --out P.csv`: predictions from a trained run's kept federation, by the
path the run was trained on:

- in process (the secondaries' states kept in the run folder): app/vfl/predict_csv.py;
- through `flwr run` in simulation (each secondary kept its own): the predict mode of the same
  apps (app/vfl/predict_server.py), with the training's run config plus the predict-* keys;
- on a deployment (--deployment DIR): the primary queries the linkage service, then `flwr run`
  in predict mode (deploy/predict.py);
- Entity Augmentation runs: entities named by id (NEW holds the ids), in process
  (app/entity_aug/predict.py) or, for a run trained through `flwr run` (each secondary kept its own
  state), through `flwr run` in predict mode (fedsim/predict_ea.py, app/entity_aug/predict_server.py);
- an ensemble (--member RUN, repeated): each member by its own path, their mean at --out
  (fedsim/predict_ensemble.py).

Exit 0 only with the output written. Bad input is refused here, before any Flower process
starts: exit 2, one line; a failed run: exit 1. The output replaces --out only when whole, so a
failed predict leaves an older --out byte-identical and says so (app/predict_files.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

from app.predict_files import output_refusal, skipped_path
from app.run_files import CONFIG
from fedsim.ensemble_step import kept_members
from fedsim.helpfmt import HelpFormatter
from files.source_tree import inside_source


def add_parser(sub) -> None:
    s = sub.add_parser("predict", help="predict new records with a trained run", formatter_class=HelpFormatter)
    s.add_argument("run_dir", type=Path, help="the trained run's folder")
    s.add_argument(
        "new",
        type=Path,
        help="CSV of new primary records (raw columns) or .npz of prepared arrays; "
        "Entity Augmentation: a CSV of entity ids",
    )
    s.add_argument("--out", type=Path, required=True, help="the predictions CSV")
    s.add_argument(
        "--id-column",
        default="",
        help="a column of NEW naming each record ('' = row number); Entity Augmentation: the entity id column",
    )
    s.add_argument("--explain", action="store_true", help="add each record's neighbours, similarities, weights")
    s.add_argument(
        "--unknown",
        choices=("ignore", "refuse"),
        default="ignore",
        help="a category unseen in training: no one-hot feature set (ignore), or an error",
    )
    s.add_argument(
        "--skip-invalid",
        action="store_true",
        help="predict the records it can; the others (a non-number in a numeric column, a missing "
        "identifier, with --unknown refuse an unseen category) are counted on stderr and listed "
        "in <out stem>.skipped.csv (line, id, reason); exit 0 only if one was predicted",
    )
    s.add_argument(
        "--member",
        type=Path,
        action="append",
        default=[],
        help="another trained member of an ensemble (run-config member; repeat): each member predicts "
        "by its own path, the output is their mean (fedsim/predict_ensemble.py)",
    )
    s.add_argument(
        "--alone",
        action="store_true",
        help="predict with RUN alone where its training kept an ensemble (ensemble.json): by default "
        "a kept ensemble's members all predict and the output is their mean",
    )
    s.add_argument("--deployment", type=Path, default=None, help="the `fedsim deploy up` folder it trained on")
    s.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="seconds before a prediction through `flwr run` (a run trained in simulation) is stopped",
    )


def _manifest(run_dir: Path) -> dict:
    from app.kept import read_manifest  # lazy: numpy and torch, off `fedsim --help`
    from app.run_status import require_finished  # lazy: numpy and torch, off `fedsim --help`

    require_finished(run_dir, kept=True)
    return read_manifest(run_dir)


def command(args: argparse.Namespace) -> int:
    try:
        problem = _refused(args)
        if problem:
            print(f"fedsim predict: {problem}", file=sys.stderr)
            return 2
        meta = _manifest(args.run_dir)
    except Exception as e:  # noqa: BLE001 - no usable run (or a file of it cut short): named
        from app.predict_files import left_note  # lazy: numpy, off `fedsim --help`

        print(f"fedsim predict: {type(e).__name__}: {e}{left_note(args.out)}", file=sys.stderr)
        return 1
    if meta.get("mode") == "entity-aug":
        from app.entity_aug.kept import upgrade  # a manifest from an older version says "guest_states"

        meta = upgrade(meta)
    if not args.member and not args.alone:
        args.member = kept_members(args.run_dir)  # the run's kept ensemble (fedsim train --budget), if any
        if args.member:
            n = len(args.member) + 1
            print(f"fedsim predict: {args.run_dir} kept an ensemble of {n}: their mean (--alone: the run alone)")
    if args.member:
        from fedsim.predict_ensemble import predict_members  # lazy: numpy, torch, pandas

        return predict_members(args, lambda m, member_args: PATHS[_path(m, member_args)](m, member_args))
    return PATHS[_path(meta, args)](meta, args)


def _refused(args: argparse.Namespace) -> str | None:
    """Why the command cannot start (exit 2): no such run folder, --out where it may not go; else None."""
    refused = output_refusal(args.out, args.new)
    if refused:
        return refused
    if inside_source(args.out):
        return (
            f"--out {args.out}: {inside_source(args.out)}; write predictions into a work folder outside the "
            "source (git ignores work/ and runs/)"
        )
    if not args.run_dir.is_dir():
        return f"no run folder {args.run_dir} (RUN names the folder a `fedsim train` wrote, e.g. runs/<run-name>)"
    runs = (args.run_dir, *(args.member or []), *kept_members(args.run_dir))  # read or not, their files stay theirs
    for run in runs:
        data = _data_files(Path(run))
        for written in (args.out.resolve(), skipped_path(args.out.resolve())):  # its list too, written or removed
            if written.is_relative_to(Path(run).resolve()):
                return f"--out {args.out} writes {written} inside the run folder {run}, whose files are the run's; write elsewhere"
            if written in data:
                return f"--out {args.out} writes {written}, a file of the run's data, which training and predict read; write elsewhere"
    return None


def _data_files(run: Path) -> set[Path]:
    """The files a run was trained on: its data folder's parties.toml and each party's file there
    (its config.json and parties.toml say which; none where they cannot be read)."""
    try:
        folder = Path(json.loads((run / CONFIG).read_text())["run"]["data_dir"])
        spec = tomllib.loads((folder / "parties.toml").read_text(encoding="utf-8-sig"))
        parties = [spec.get("primary", {}), *(spec.get("secondaries") or {}).values()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()
    named = [folder / str(p["file"]) for p in parties if isinstance(p, dict) and "file" in p]
    return {p.resolve() for p in (folder / "parties.toml", *named)}


def _path(meta: dict, args: argparse.Namespace) -> str:
    """The path the run was trained on (a key of :data:`PATHS`): its mode, and whether each
    secondary kept its own state ("parties": trained through `flwr run`) or the run folder did."""
    parties = meta.get("secondary_states", "run") == "parties"
    if meta.get("mode") == "entity-aug":
        return "entity-aug flower" if parties else "entity-aug in process"
    if not parties:
        return "in process"
    return "deployment" if args.deployment else "flower"


def _entity_aug_flower(meta: dict, args: argparse.Namespace) -> int:
    from fedsim.predict_ea import fedsim_predict  # lazy: torch, flwr and pandas, for Entity Augmentation only

    return fedsim_predict(meta, args)


def _entity_aug_in_process(meta: dict, args: argparse.Namespace) -> int:
    from app.entity_aug.predict import main as ea_main  # lazy: torch, flwr and pandas, for this path only

    return ea_main(
        [
            str(args.run_dir),
            "--ids",
            str(args.new),
            "--out",
            str(args.out),
            *(["--ids-column", args.id_column] if args.id_column else []),
            *(["--skip-invalid"] if args.skip_invalid else []),
        ]
    )


def _in_process(meta: dict, args: argparse.Namespace) -> int:
    from app.vfl.predict_csv import main as in_process  # lazy: torch, flwr and pandas, for this path only

    return in_process(
        [
            str(args.run_dir),
            str(args.new),
            "--out",
            str(args.out),
            "--id-column",
            args.id_column,
            "--unknown",
            args.unknown,
            *(["--explain"] if args.explain else []),
            *(["--skip-invalid"] if args.skip_invalid else []),
        ]
    )


def _deployed(meta: dict, args: argparse.Namespace) -> int:
    from deploy.predict import command as deployed  # lazy: httpx, for a deployment only

    ns = argparse.Namespace(
        folder=args.deployment,
        run=args.run_dir.name,
        input=args.new,
        out=args.out,
        id_column=args.id_column,
        explain=args.explain,
        skip_invalid=args.skip_invalid,
    )
    return deployed(ns)


def _flower(meta: dict, args: argparse.Namespace) -> int:
    """Through `flwr run` in simulation: the input checked here first, the output replaced when whole."""
    from app.vfl.predict_csv import NewRecords, flower_predict  # lazy: torch, flwr, pandas: this path only

    return flower_predict(
        args.run_dir,
        NewRecords(args.new, args.id_column, args.unknown, args.skip_invalid),
        args.out,
        who="fedsim predict",
        start=lambda new, partial, id_column: _simulation(meta, args, new, partial, id_column),
    )


PATHS = {
    "entity-aug flower": _entity_aug_flower,
    "entity-aug in process": _entity_aug_in_process,
    "in process": _in_process,
    "deployment": _deployed,
    "flower": _flower,
}


def _simulation(meta: dict, args: argparse.Namespace, new: Path, out: Path, id_column: str) -> bool:
    """`flwr run` in predict mode with the training's run config, reading ``new`` and writing
    ``out``; True when it wrote ``out``."""
    from fedsim.predict_flower import predict_through_flower  # lazy: torch and flwr, for a run through Flower only

    keys = {
        "predict-input": str(new),
        "predict-output": str(out),
        "predict-id-column": id_column,
        "predict-explain": args.explain,
        "predict-unknown": args.unknown,
    }
    return predict_through_flower(args.run_dir, meta, keys, len(meta["secondaries"]), args.timeout, out)
