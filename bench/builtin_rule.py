"""The one rule on a built-in data set: `fedsim train`'s default (the recipe search on the run's
own rows) against the recipe chosen by hand on that set's validation (``hparams = "dataset"``,
what the default was), the reference's values as given (what `flwr run` trains) and the paper's
FedSim, paired over seeds, each `fedsim train` in process on the same seed's split.

    OMP_NUM_THREADS=1 python -m bench.builtin_rule SET --rows N --out OUT [--seeds 0,1,2,3,4] [--epochs E]

Rows go to OUT/rows.jsonl (a rerun skips what is there); the table (bench/recipe_heldout.py's)
is printed at the end, with the search's choices and its time against the hand-chosen run's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.recipe_heldout import table
from fedsim.cli import main as fedsim

GIVEN = ["--recipe", "given", "--no-yardstick"]
VARIANTS = {  # name -> `fedsim train` arguments beyond the data set, seed, size and folders
    "default (search)": [],
    "hand-chosen (hparams dataset)": [*GIVEN, "-c", "hparams=dataset"],
    "reference as given (flwr run's)": GIVEN,
    "fedsim (paper)": [*GIVEN, "--method", "fedsim"],
}


def run_one(args: argparse.Namespace, seed: int, variant: str) -> dict:
    name = f"s{seed}-{list(VARIANTS).index(variant)}"
    argv = ["train", "--dataset", args.dataset, "--out-dir", str(args.out / "runs"), "--run-name", name]
    argv += ["--seed", str(seed), "--engine", "inprocess", "-c", f"n-rows={args.rows}", *VARIANTS[variant]]
    argv += ["--epochs", str(args.epochs)] if args.epochs else []
    t0 = time.monotonic()
    code = fedsim(argv)
    row = {"seed": seed, "variant": variant, "seconds": time.monotonic() - t0, "set": args.dataset}
    run = args.out / "runs" / name
    if code != 0:
        return {**row, "failed": code}
    summary = json.loads((run / "summary.json").read_text())
    row |= {"test": summary["test"], "val": summary["val"], "rows": args.rows}
    if (run / "yardstick.json").exists():
        row["yardstick"] = json.loads((run / "yardstick.json").read_text())
    if (run / "search.json").exists():
        search = json.loads((run / "search.json").read_text())
        row |= {"chosen": search["chosen"], "scores": {c["name"]: c["score"] for c in search["candidates"]}}
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset")
    ap.add_argument("--rows", type=int, required=True, help="the primary's records (run-config n-rows)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--epochs", type=int, default=0, help="0: the data set's own")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "rows.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    done = {(r["seed"], r["variant"]) for r in rows if "test" in r}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for variant in VARIANTS:
            if (seed, variant) not in done:
                row = run_one(args, seed, variant)
                rows.append(row)
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"[{time.strftime('%H:%M:%S')}] seed {seed} {variant}: {row.get('test', 'FAILED')}", flush=True)
    print("\n".join(table(rows, tuple(VARIANTS), "hand-chosen (hparams dataset)")))


if __name__ == "__main__":
    main()
