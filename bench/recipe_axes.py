"""Would the recipe search gain from searching K or the learning rate? fedsim_attn as the search's
first candidate trains it (`--recipe given`), and the same at other learning rates and K, paired
over seeds on the same split, in process; validation (what a search could choose on) and test
(reported) at the best-validation epoch, each variant minus the base.

    OMP_NUM_THREADS=1 python -m bench.recipe_axes (--data-dir DIR | --dataset SET --rows N) --out OUT [--seeds 0,1,2]

Rows go to OUT/rows.jsonl (a rerun skips what is there; bench/recipe_heldout.py's format).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.recipe_heldout import read_row, run_rows
from fedsim.cli import main as fedsim

BASE = "base (lr 1e-3, K 50)"
VARIANTS = {  # name -> `fedsim train` arguments beyond the base's
    BASE: [],
    "lr 3e-4": ["-c", "lr=3e-4"],
    "lr 3e-3": ["-c", "lr=3e-3"],
    "K 10": ["-c", "k=10"],
    "K 20": ["-c", "k=20"],
}


def run_one(args: argparse.Namespace, seed: int, variant: str) -> dict:
    name = f"s{seed}-{list(VARIANTS).index(variant)}"
    data = ["--dataset", "csv", "--data-dir", str(args.data_dir)] if args.data_dir else ["--dataset", args.dataset]
    argv = ["train", *data, "--out-dir", str(args.out / "runs"), "--run-name", name, "--seed", str(seed)]
    argv += ["--engine", "inprocess", "--recipe", "given", "--no-yardstick", *VARIANTS[variant]]
    argv += ["-c", f"n-rows={args.rows}", "-c", "patience=10", "--epochs", "200"] if args.dataset else []
    t0 = time.monotonic()
    code = fedsim(argv)
    row = {"seed": seed, "variant": variant, "seconds": time.monotonic() - t0}
    return read_row(args.out / "runs" / name, row) if code == 0 else {**row, "failed": code}


def table(rows: list[dict]) -> list[str]:
    """Per variant: validation and test (mean ± sd over seeds), and minus the base, paired."""
    key = "rmse" if "rmse" in rows[0]["test"] else "accuracy"
    at = {(r["seed"], r["variant"]): r for r in rows if "test" in r}
    seeds = sorted({s for s, _ in at})
    out = [f"{key} over seeds {seeds}: validation, test (mean ± sd); minus the base, paired (mean ± sd)"]
    for name in VARIANTS:
        have = [s for s in seeds if (s, name) in at and (s, BASE) in at]
        if not have:
            continue
        line = f"  {name:22s}"
        for part in ("val", "test"):
            vals = [at[(s, name)][part][key] for s in have]
            diffs = [at[(s, name)][part][key] - at[(s, BASE)][part][key] for s in have]
            line += f" | {part} {statistics.mean(vals):9.4f} ± {statistics.pstdev(vals):7.4f}"
            line += f" ({statistics.mean(diffs):+8.4f} ± {statistics.pstdev(diffs):7.4f})" if name != BASE else ""
        out.append(line)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, help="an own-data folder (parties.toml and its CSVs)")
    ap.add_argument("--dataset", help="a built-in set instead, sampled to --rows, to convergence (patience 10)")
    ap.add_argument("--rows", type=int, default=1500)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", default="0,1,2")
    args = ap.parse_args(argv)
    if bool(args.data_dir) == bool(args.dataset):
        ap.error("give one of --data-dir or --dataset")
    args.out = args.out.resolve()
    args.data_dir = args.data_dir.resolve() if args.data_dir else None
    rows = run_rows(args.out, args.seeds, list(VARIANTS), lambda seed, variant: run_one(args, seed, variant))
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
