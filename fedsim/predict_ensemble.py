"""`fedsim predict RUN NEW --out P.csv --member RUN_1 --member RUN_2`: an ensemble's predictions.

Each member predicts NEW by the path it was trained on (in process, `flwr run`, a deployment:
fedsim/predict.py), into a file of its own beside --out; the ensemble is their mean
(app/vfl/ensemble.py `average`: regression values, class probabilities), written over --out
only when every member succeeded and their rows agree. Refused by name before any member
predicts (app/vfl/ensemble.py `check_members`): members of another seed, split or data, the same
member twice, with noise members of different linkage releases. A member that fails stops the
ensemble: exit non-zero, an older --out left byte-identical, the members' files removed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from app.kept import write_csv
from app.predict_files import left_note, skipped_path
from app.vfl.ensemble import average, check_members
from app.vfl.predict import Prediction
from datasets.cells import column_text


def predict_members(args: argparse.Namespace, predict_one: Callable[[dict, argparse.Namespace], int]) -> int:
    """``predict_one(meta, args)`` for each member into its own file, then their mean at --out."""
    runs = [args.run_dir, *args.member]
    if args.explain:
        print(
            "fedsim predict: --explain is per run; an ensemble (--member, or one its training kept) predicts "
            "without it (--alone explains the run alone)",
            file=sys.stderr,
        )
        return 2
    try:
        metas = check_members(runs, in_process=False)
    except Exception as e:  # noqa: BLE001 - members that cannot make one ensemble: named
        print(f"fedsim predict: {type(e).__name__}: {e}{left_note(args.out)}", file=sys.stderr)
        return 1
    tag = secrets.token_hex(4)
    outs = [args.out.resolve().with_name(f".{args.out.stem}.member{i}-{tag}.csv") for i in range(len(runs))]
    try:
        for i, (run, meta, out) in enumerate(zip(runs, metas, outs, strict=True)):
            with contextlib.redirect_stdout(io.StringIO()):  # a member's closing line names its own file
                code = predict_one(meta, argparse.Namespace(**{**vars(args), "run_dir": run, "out": out, "member": []}))
            if code != 0:
                print(f"fedsim predict: ensemble member {i} ({run}) failed{left_note(args.out)}", file=sys.stderr)
                return code
        frame = combine([member_frame(o) for o in outs], metas[0]["head"]["task"], runs)
        write_csv(frame, args.out)
        if args.skip_invalid:  # every member read the same input: member 0's list is the ensemble's
            os.replace(skipped_path(outs[0]), skipped_path(args.out))
        else:  # an earlier predict's list does not stand beside this output
            skipped_path(args.out).unlink(missing_ok=True)
    except Exception as e:  # noqa: BLE001 - the outcome is the exit status, with the reason
        print(f"fedsim predict: {type(e).__name__}: {e}{left_note(args.out)}", file=sys.stderr)
        return 1
    finally:
        for out in outs:
            out.unlink(missing_ok=True)
            skipped_path(out).unlink(missing_ok=True)
    print(f"{len(frame)} predictions, the mean of {len(runs)} members -> {args.out}")
    return 0


def member_frame(path: Path) -> pd.DataFrame:
    """A member's output as it wrote it: its id column (the first) as text, exactly ('007' stays
    '007', 'NA' an id); the predictions as numbers."""
    frame = pd.read_csv(path)
    ids = frame.columns[0]
    frame[ids] = column_text(path, ids)
    return frame


def combine(frames: list[pd.DataFrame], task: str, runs: list[Path]) -> pd.DataFrame:
    """One output from the members' (same columns and rows: the id column first)."""
    first = frames[0]
    for run, frame in zip(runs[1:], frames[1:], strict=True):
        if list(frame.columns) != list(first.columns) or not frame.iloc[:, 0].equals(first.iloc[:, 0]):
            raise ValueError(f"ensemble member {run} predicted other records or columns than {runs[0]}")
    classes = [c for c in first.columns if c.startswith("p_")]

    def prediction(frame: pd.DataFrame) -> Prediction:
        proba = frame[classes].to_numpy() if classes else None  # (q, C)
        return Prediction(frame["prediction"].to_numpy(), proba, None, {}, 0, {})

    values, proba = average([prediction(f) for f in frames], task)
    out = first.iloc[:, :1].copy()
    out["prediction"] = values if proba is None else proba.argmax(axis=1)  # the class, as one run writes it
    for c, name in enumerate(classes):
        out[name] = proba[:, c]
    return out
