"""`fedsim train --budget 6` on an own-data folder nobody here tuned on: the search's three
candidates, the run, then two more members of it; does the ensemble pay, and does the rule keep
it when it does? Paired over seeds: the run alone (member 0: what the default budget gives) against
the ensemble of 3, on validation (what the rule reads) and test (reported), beside the run's
yardstick (the primary alone, the pooled reference).

    OMP_NUM_THREADS=1 python -m bench.ensemble_heldout DATA_DIR --out OUT [--seeds 0,1,2] [--budget 6]
    OMP_NUM_THREADS=1 python -m bench.ensemble_heldout house3 --rows 1500 --epochs 40 --out OUT

Rows go to OUT/rows.jsonl (a rerun skips the seeds already there); the table is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from fedsim.cli import main as fedsim


def run_one(args: argparse.Namespace, seed: int) -> dict:
    """One seed's `fedsim train --budget`: own data (a folder) or a built-in set (with --rows, --epochs)."""
    data, out, budget = args.data_dir, args.out, args.budget
    if Path(data).is_dir():
        argv = ["train", "--dataset", "csv", "--data-dir", str(data)]
    else:  # a built-in set, as bench/builtin_rule.py trains it
        argv = ["train", "--dataset", str(data), "-c", f"n-rows={args.rows}"]
        argv += ["--epochs", str(args.epochs)] if args.epochs else []
    argv += ["--out-dir", str(out / "runs"), "--run-name", f"s{seed}", "--seed", str(seed)]
    argv += ["--engine", "inprocess", "--budget", str(budget)]
    t0 = time.monotonic()
    code = fedsim(argv)
    row = {"seed": seed, "budget": budget, "seconds": round(time.monotonic() - t0, 1)}
    if code != 0:
        return {**row, "failed": code}
    run = out / "runs" / f"s{seed}"
    ens = json.loads((run / "ensemble.json").read_text())
    yard = json.loads((run / "yardstick.json").read_text())
    chosen = json.loads((run / "search.json").read_text()).get("chosen")
    return {**row, "chosen": chosen, "ensemble": ens, "yardstick": yard}


def _mean_sd(xs: list[float]) -> str:
    return f"{statistics.fmean(xs):.4g} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3g}"


def table(rows: list[dict]) -> list[str]:
    ok = [r for r in rows if "failed" not in r]
    if not ok:
        return ["no finished row"]
    ens0 = ok[0]["ensemble"]
    key, metric = ens0["selected_on"], ens0["metric"]
    lower = metric == "rmse"
    out = [
        f"| seed | chosen | val {key}: 1 / 2 / 3 members | test {metric}: 1 / 2 / 3 | kept | pooled | primary alone |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in ok:
        e, y = r["ensemble"], r["yardstick"]
        val = " / ".join(f"{v[key]:.4f}" for v in e["val"])
        test = " / ".join(f"{t[metric]:.4f}" for t in e["test"])
        pooled = y["pooled"].get("test", float("nan"))
        out.append(
            f"| {r['seed']} | {r['chosen']} | {val} | {test} | {e['kept']} | {pooled:.4f} | {y['primary_alone']['test']:.4f} |"
        )
    sign = 1 if lower else -1  # > 0: the ensemble (or the federated model) ahead

    def gain(a: list[float], b: list[float]) -> str:
        d = [sign * (x - z) for x, z in zip(a, b, strict=True)]
        return f"{_mean_sd(d)} (ahead in {sum(x > 0 for x in d)} of {len(d)})"

    one = [r["ensemble"]["test"][0][metric] for r in ok]
    three = [r["ensemble"]["test"][-1][metric] for r in ok]
    fed = [r["yardstick"]["federated"] for r in ok]  # the kept model's test: the ensemble where kept
    pooled = [r["yardstick"]["pooled"]["test"] for r in ok]
    val1 = [r["ensemble"]["val"][0][key] for r in ok]
    val3 = [r["ensemble"]["val"][-1][key] for r in ok]
    out += [
        f"validation, the run alone minus 3 members ({key}, > 0: the ensemble ahead): {gain(val1, val3)}",
        f"test, the run alone minus 3 members ({metric}): {gain(one, three)}",
        f"test, pooled reference minus the run alone: {gain(pooled, one)}",
        f"test, pooled reference minus the kept model (the ensemble where kept): {gain(pooled, fed)}",
        f"kept in {sum(r['ensemble']['kept'] for r in ok)} of {len(ok)}; seconds per seed: "
        + ", ".join(str(r["seconds"]) for r in ok),
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dir", type=Path, help="an own-data folder, or a built-in set's name (with --rows)")
    ap.add_argument("--rows", type=int, default=0, help="a built-in set's n-rows (0: all)")
    ap.add_argument("--epochs", type=int, default=0, help="a built-in set's epochs (0: its default)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--budget", type=int, default=6)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    done = {r["seed"] for r in rows if "failed" not in r}
    for seed in [int(s) for s in args.seeds.split(",")]:
        if seed in done:
            continue
        row = run_one(args, seed)
        rows.append(row)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
    print(f"{args.data_dir}, budget {args.budget}:")
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
