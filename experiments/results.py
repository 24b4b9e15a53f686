"""Train experiments from conf/*.toml through `flwr run` and print their best-validation
epoch's validation and test metrics (test is never used for selection).

    python -m experiments.results hdb_fedsim hdb_solo synthetic_fedsim synthetic_solo [--seeds 0] [--set epochs=3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from app.run_record import machine, read_metrics
from experiments.runner import (
    git_rev,
    load_conf,
    parse_overrides,
    run_flower,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("confs", nargs="+", help="names of conf/<name>.toml")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds")
    ap.add_argument("--set", action="append", default=[], help="override key=value (TOML value)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    overrides = parse_overrides(args.set)
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} | {machine()} | commit {git_rev()}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for conf in args.confs:
            for seed in (int(s) for s in args.seeds.split(",")):
                values = {**load_conf(conf), **overrides, "seed": seed}
                summary, run_dir, wall = run_flower(values, Path(tmp), f"{conf}-s{seed}")
                row = {
                    "conf": conf,
                    "seed": seed,
                    "best_epoch": summary["best_epoch"],
                    "epochs": summary["epochs_run"],
                    "val": summary["val"],
                    "test": summary["test"],
                    "wall_s": round(wall, 1),
                    "train_s_per_epoch": round(sum(summary["seconds"]["epochs"]) / summary["epochs_run"], 2),
                    "epochs_metrics": read_metrics(run_dir),
                }
                rows.append(row)
                metrics = " ".join(f"test_{k}={v:.4f}" for k, v in row["test"].items())
                vals = " ".join(f"val_{k}={v:.4f}" for k, v in row["val"].items())
                print(
                    f"{conf:22s} seed {seed}: best epoch {row['best_epoch']}/{row['epochs']} {vals} {metrics} "
                    f"({row['train_s_per_epoch']} s/epoch train, {row['wall_s']} s wall)",
                    flush=True,
                )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
