"""Early stopping on a classifier's validation accuracy against its validation log loss, paired:
each run trains once with a long patience (60 epochs, at most 150) and both rules are read off its
one trajectory (the epochs are the same until a rule stops), patience 10 as the default's.

    OMP_NUM_THREADS=1 python -m bench.stopping_rules --out OUT (--data-dir DIR | --dataset NAME --n-rows N) \
        [--seeds 0,1,2,3,4] [--methods fedsim_attn,fedsim]

Each run: `fedsim train ... --engine inprocess --recipe given --no-yardstick -c patience=60 -c
epochs=150`, the parties' noise fixed per seed ($FEDSIM_PARTY_SEED), kept under OUT/runs (a rerun
reads a finished run instead of training it again). Prints per run and per method: epochs run,
the chosen epoch's validation and test accuracy under each rule."""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from fedsim.cli import main as fedsim
from strategies.heads import TaskHead
from strategies.records import EpochRecord, best_epoch, early_stop

PATIENCE = 10  # the default's (app/config.py UNTUNED_PATIENCE)
RULES = {"accuracy": TaskHead("binary"), "log_loss": TaskHead("binary", select="loss")}  # what each selects on


def stop(rows: list[dict], head: TaskHead, patience: int = PATIENCE) -> tuple[int, dict]:
    """(epochs the rule runs, the epoch it reports) on one trajectory's metrics rows, by the
    training loop's own rule (strategies/records.py) with ``head``'s selection key."""
    records = [EpochRecord(r["epoch"], 0.0, 0, 0, 0.0, val=r["val"]) for r in rows]
    n = next((i for i in range(1, len(records) + 1) if early_stop(records[:i], head, patience)), len(records))
    return n, rows[best_epoch(records[:n], head).epoch]


def train(args, seed: int, method: str) -> Path:
    run = args.out / "runs" / f"{method}-s{seed}"
    if (run / "summary.json").exists():
        return run
    os.environ["FEDSIM_PARTY_SEED"] = f"sel-{seed}"  # the seed string of the runs docs/fedsim-attn.md records
    data = ["--dataset", "csv", "--data-dir", str(args.data_dir)] if args.data_dir else ["--dataset", args.dataset]
    argv = ["train", *data, "--out-dir", str(args.out / "runs"), "--run-name", run.name, "--seed", str(seed)]
    argv += ["--engine", "inprocess", "--recipe", "given", "--no-yardstick", "--method", method]
    argv += ["-c", "patience=60", "-c", "epochs=150"] + (["-c", f"n-rows={args.n_rows}"] if args.n_rows else [])
    if fedsim(argv) != 0:
        raise SystemExit(f"run {run} failed")
    return run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data-dir", type=Path)
    ap.add_argument("--dataset", default="")
    ap.add_argument("--n-rows", type=int, default=0)
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--methods", default="fedsim_attn,fedsim")
    args = ap.parse_args(argv)
    table: dict[str, list[tuple]] = {}
    for method in args.methods.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            run = train(args, seed, method)
            rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            out = [stop(rows, head) for head in RULES.values()]
            table.setdefault(method, []).append(
                tuple(x for n, r in out for x in (n, r["val"]["accuracy"], r["test"]["accuracy"]))
            )
            print(
                f"{method} s{seed}: "
                + " | ".join(
                    f"{k}: ran {n}, epoch {r['epoch']}, val {r['val']['accuracy']:.4f}, test {r['test']['accuracy']:.4f}"
                    for k, (n, r) in zip(RULES, out)
                )
            )
    print(
        "\n| method | rule | epochs run | val accuracy | test accuracy | test, loss rule minus accuracy rule (better in) |"
    )
    print("|---|---|---|---|---|---|")
    for method, rows in table.items():
        diff = [r[5] - r[2] for r in rows]
        for i, key in enumerate(RULES):
            cols = [statistics.mean(r[3 * i + j] for r in rows) for j in range(3)]
            extra = (
                f"{statistics.mean(diff):+.4f} ± {statistics.stdev(diff) if len(diff) > 1 else 0:.4f} ({sum(d > 0 for d in diff)} of {len(diff)})"
                if i
                else ""
            )
            print(f"| {method} | {key} | {cols[0]:.0f} | {cols[1]:.4f} | {cols[2]:.4f} | {extra} |")


if __name__ == "__main__":
    main()
