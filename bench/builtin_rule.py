"""The one rule on a built-in data set: `fedsim train`'s default (the recipe search on the run's
own rows) against the recipe chosen by hand on that set's validation (``hparams = "dataset"``,
what the default was), the reference's values as given (what `flwr run` trains) and the paper's
FedSim, paired over seeds, each `fedsim train` in process on the same seed's split.

    OMP_NUM_THREADS=1 python -m bench.builtin_rule SET --rows N --out OUT [--seeds 0,1,2,3,4] [--epochs E] [--variants 0,1,2,3]

Rows go to OUT/rows.jsonl (a rerun skips what is there); the table (bench/recipe_heldout.py's)
is printed at the end, with the search's choices and its time against the reference's run (the
default's time includes its yardstick, a few seconds; two benches side by side share the cores,
so a quiet cost is measured on its own: docs/benchmarks.md "The recipe search on the built-in sets").
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.recipe_heldout import read_row, run_rows, table
from fedsim.cli import main as fedsim

GIVEN = ["--recipe", "given", "--no-yardstick"]
VARIANTS = {  # name -> `fedsim train` arguments beyond the data set, seed, size and folders
    "default (search)": [],
    "hand-chosen (hparams dataset)": [*GIVEN, "-c", "hparams=dataset"],
    "reference as given (flwr run's)": GIVEN,
    "fedsim (paper)": [*GIVEN, "--method", "fedsim"],
    # not a default: measured beside it. The ensemble's members now come before the last three
    # candidates (fedsim/recipe_search.py plan), so all six candidates come with two members; the
    # rows of 2026-12-07 02:xx UTC ran `--budget 7`, six candidates and no members
    "search at budget 9 (all six candidates, the attention's start too, and an ensemble)": ["--budget", "9"],
}


def run_one(args: argparse.Namespace, seed: int, variant: str) -> dict:
    name = f"s{seed}-{list(VARIANTS).index(variant)}"
    argv = ["train", "--dataset", args.dataset, "--out-dir", str(args.out / "runs"), "--run-name", name]
    argv += ["--seed", str(seed), "--engine", "inprocess", "-c", f"n-rows={args.rows}", *VARIANTS[variant]]
    argv += ["--epochs", str(args.epochs)] if args.epochs else []
    t0 = time.monotonic()
    code = fedsim(argv)
    row = {"seed": seed, "variant": variant, "seconds": time.monotonic() - t0, "set": args.dataset, "rows": args.rows}
    return read_row(args.out / "runs" / name, row) if code == 0 else {**row, "failed": code}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset")
    ap.add_argument("--rows", type=int, required=True, help="the primary's records (run-config n-rows)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--epochs", type=int, default=0, help="0: the data set's own")
    ap.add_argument("--variants", default="", help="which variants, by their place in VARIANTS (default: all)")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()
    chosen = [list(VARIANTS)[int(i)] for i in args.variants.split(",")] if args.variants else list(VARIANTS)
    rows = run_rows(args.out, args.seeds, chosen, lambda seed, variant: run_one(args, seed, variant))
    print("\n".join(table(rows, tuple(chosen), "reference as given (flwr run's)")))


if __name__ == "__main__":
    main()
