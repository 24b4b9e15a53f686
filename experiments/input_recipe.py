"""Input recipes against each other on validation: the same runs (dataset, seed, budget)
with each party's numeric inputs standardised ("standard") or mapped through their training
quantiles to a normal ("quantile", datasets/transform.py), in process.

    python -m experiments.input_recipe --dataset house --scales standard,quantile --seeds 0,1
        [--n-rows N] [--epochs E] [--set key=value ...]

Prints one line per run (validation and test metric at the best validation epoch, epochs run)
and, per recipe, the paired validation difference to the first recipe over the same seeds: the
choice is made on validation; test is reported only.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from app.config import RunConfig
from app.vfl.inprocess import run_experiment
from experiments.runner import parse_overrides


def one(values: dict, scale: str, seed: int) -> dict:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        cfg = RunConfig.from_flower({**values, "input-scale": scale, "seed": seed, "out-dir": tmp})
        s = run_experiment(cfg, Path(tmp) / "run")
    key = next(iter(s["val"]))
    return {
        "scale": scale,
        "seed": seed,
        "metric": key,
        "val": s["val"][key],
        "test": s["test"][key],
        "best": s["best_epoch"],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--scales", default="standard,quantile")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--n-rows", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    values = {"dataset": args.dataset, "n-rows": args.n_rows, "epochs": args.epochs, "privacy-report": False}
    values |= {"exchange-report": False} | parse_overrides(args.set)
    scales, seeds = args.scales.split(","), [int(s) for s in args.seeds.split(",")]
    runs = {}
    for seed in seeds:  # recipes interleaved per seed: a machine's load falls on both alike
        for scale in scales:
            r = runs[scale, seed] = one(values, scale, seed)
            print(
                f"{args.dataset} {scale} seed {seed}: val {r['metric']} {r['val']:.4f} | test {r['test']:.4f} | best epoch {r['best']}",
                flush=True,
            )
    for scale in scales[1:]:
        diffs = [runs[scale, s]["val"] - runs[scales[0], s]["val"] for s in seeds]
        sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
        print(
            f"{args.dataset} {scale} - {scales[0]} on validation: {statistics.mean(diffs):+.4f} ± {sd:.4f} over seeds {seeds}"
        )


if __name__ == "__main__":
    main()
