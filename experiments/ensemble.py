"""Score ensembles of a sweep's members, or of your own runs, on validation and test (app/vfl/ensemble.py).

    python -m experiments.ensemble VARIANT_DIR [VARIANT_DIR ...] --seeds 0 1 2 3 4 [--json OUT]
                                   [--reference runs/reference/D.csv]
    python -m experiments.ensemble RUN [RUN ...] [--json OUT] [--reference ...]

Each VARIANT_DIR is a sweep's <root>/<sweep>/<dataset>/<variant> folder holding s<seed>/ runs; the
members of seed s are VARIANT_DIR/s<s> in the order given (members of one seed's split: run-config
`member`). Without --seeds the folders are runs themselves (`fedsim train` run folders, member 0
first, the others trained with `-c member=1`, `-c member=2`, ...): one split, the runs' seed. For each seed, each member predicts its validation and test records as new (tau = 1:
the evaluation's own predictions, which is checked: a member alone must give the metric its
summary.json reports, or the script stops), and the ensembles of the first 1, 2, ... members
are scored. Prints per seed and the mean over seeds; the test metric is reported, never chosen on.
--reference: the pooled-data reference's rows (experiments/reference.py --out) for the same
seeds; each ensemble's test minus the reference's, per seed, and in how many seeds it is ahead.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

from app.config import RunConfig
from app.data import load_data
from app.kept import KeptError, read_manifest
from app.vfl.ensemble import by_size, predict_ensemble
from strategies.heads import TaskHead

SETUP = ("metric", "config", "max_iter", "learning_rate")  # a reference row's configuration (experiments/reference.py)


def score_seed(run_dirs: list[Path]) -> dict:
    """{"val": [metric of the first 1, 2, ... members], "test": [...]}, key metric, one seed."""
    meta = read_manifest(Path(run_dirs[0]))
    head = TaskHead(**meta["head"])
    ds = load_data(RunConfig.of(**meta["run"]))
    rows = {"val": ds.split.val, "test": ds.split.test}
    both = np.concatenate(list(rows.values()))
    _, preds = predict_ensemble(run_dirs, ds.primary.features[both], ds.primary.identifiers[both])  # each member's
    key, out = head.key_metric, {}
    start = 0
    for part, idx in rows.items():
        part_preds = [_rows(p, slice(start, start + len(idx))) for p in preds]
        start += len(idx)
        for run_dir, pred in zip(run_dirs, part_preds, strict=True):
            _check_alone(run_dir, head, pred.values, ds.labels[idx], part)
        out[part] = [m[key] for m in by_size(part_preds, head, ds.labels[idx])]
    return out


def _rows(pred, where: slice):
    """The prediction restricted to some rows (values and proba only: what averaging reads)."""
    return type(pred)(pred.values[where], None if pred.proba is None else pred.proba[where], None, {}, 0, {})


def _check_alone(run_dir: Path, head: TaskHead, values: np.ndarray, y: np.ndarray, part: str) -> None:
    """A member alone predicts its evaluation's metric (the kept model is the run's best epoch)."""
    reported = json.loads((Path(run_dir) / "summary.json").read_text())[part][head.key_metric]
    got = head.metrics(values, y)[head.key_metric]
    if not np.isclose(got, reported, rtol=1e-6, atol=1e-9):
        raise SystemExit(f"{run_dir}: predicted {part} {head.key_metric} {got} but its evaluation reported {reported}")


def reference_tests(path: Path, dataset: str, seeds: list[int]) -> dict[int, float]:
    """The reference's test metric per seed: ``dataset``'s rows in the CSV, all of one
    configuration (the last row of a seed run twice)."""
    rows = [r for r in csv.DictReader(path.open()) if r["dataset"] == dataset and int(r["seed"]) in seeds]
    setups = {tuple(r.get(c, "") for c in SETUP) for r in rows}
    if len(setups) > 1:
        raise SystemExit(f"{path}: the reference rows of {dataset} seeds {seeds} differ in {SETUP}: {sorted(setups)}")
    tests = {int(r["seed"]): float(r["test"]) for r in rows}
    missing = sorted(set(seeds) - set(tests))
    if missing:
        raise SystemExit(f"{path}: no {dataset} reference row for seed(s) {missing}")
    return tests


def against_reference(scores: dict, reference: dict[int, float], head: TaskHead) -> None:
    """Each ensemble size's test minus the reference's, per seed (accuracy in points)."""
    scale = 1.0 if head.task == "regression" else 100.0
    for k in range(len(next(iter(scores.values()))["test"])):
        diff = np.array([(sc["test"][k] - reference[s]) * scale for s, sc in scores.items()])
        ahead = sum(head.better(sc["test"][k], reference[s]) for s, sc in scores.items())
        print(
            f"{k + 1} member(s) minus the reference: {', '.join(f'{d:+.2f}' for d in diff)}; "
            f"mean {diff.mean():+.2f} ± {diff.std(ddof=1) if len(diff) > 1 else 0.0:.2f}, ahead in {ahead} of {len(diff)}"
        )


def seeds_members(folders: list[Path], seeds: list[int] | None) -> dict[int, list[Path]]:
    """{seed: its members' run folders}: a sweep's folders/s<seed>, or (no seeds) the folders as
    runs of one split, under the seed their first member ran with."""
    if seeds:
        return {s: [f / f"s{s}" for f in folders] for s in seeds}
    return {int(read_manifest(folders[0])["run"]["seed"]): list(folders)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "variants", type=Path, nargs="+", help="variant folders (or, without --seeds, runs), member 0 first"
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="the sweep's seeds; none: the folders are runs")
    ap.add_argument("--json", type=Path, default=None, help="also write the scores here")
    ap.add_argument("--reference", type=Path, default=None, help="experiments.reference's CSV of these seeds")
    args = ap.parse_args(argv)
    members = seeds_members(args.variants, args.seeds)
    try:
        scores = {s: score_seed(runs) for s, runs in members.items()}
    except KeptError as e:  # a member this scorer cannot read, named; no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    meta = read_manifest(next(iter(members.values()))[0])
    head = TaskHead(**meta["head"])
    key = head.key_metric
    n = len(args.variants)
    print(f"| seed | {' | '.join(f'{k} member(s): val / test' for k in range(1, n + 1))} |")
    print(f"|---|{'---|' * n}")
    for s, sc in scores.items():
        print(f"| {s} | {' | '.join(f'{v:.4f} / {t:.4f}' for v, t in zip(sc['val'], sc['test'], strict=True))} |")
    mean = {part: np.mean([sc[part] for sc in scores.values()], axis=0) for part in ("val", "test")}
    print(
        f"| mean ({key}) | {' | '.join(f'{v:.4f} / {t:.4f}' for v, t in zip(mean['val'], mean['test'], strict=True))} |"
    )
    if args.reference:
        against_reference(scores, reference_tests(args.reference, meta["dataset"], list(members)), head)
    if args.json:
        args.json.write_text(json.dumps({str(s): sc for s, sc in scores.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
