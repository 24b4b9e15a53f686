"""The default `fedsim train` on an own-data folder nobody here tuned on, against every federated
baseline, the neural and boosted primary alone, and the pooled reference, paired over seeds: each
variant is `fedsim train` run as a user would, in process, on the same seed's split.

    OMP_NUM_THREADS=1 python -m bench.recipe_heldout DATA_DIR --out OUT [--seeds 0,1,2,3,4] [--budget N]

Rows go to OUT/rows.jsonl (a rerun skips the seeds and variants already there); the table is
printed at the end: test metric per variant (mean ± sd over seeds), and the default minus each
(mean ± sd of the paired differences; in how many seeds the default is ahead, is the same run, is behind).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from fedsim.cli import main as fedsim

VARIANTS = {  # name -> `fedsim train` arguments beyond the data, seed and folders
    "default (search)": [],
    "fedsim_attn (old default)": ["--recipe", "given"],
    "fedsim (paper)": ["--recipe", "given", "--method", "fedsim"],
    "top1sim": ["--recipe", "given", "--method", "top1sim"],
    "solo (neural, primary alone)": ["--recipe", "given", "--method", "solo"],
}


def run_one(data: Path, out: Path, seed: int, variant: str, budget: int | None = None) -> dict:
    name = f"s{seed}-{list(VARIANTS).index(variant)}"
    argv = ["train", "--dataset", "csv", "--data-dir", str(data), "--out-dir", str(out / "runs")]
    argv += ["--run-name", name, "--seed", str(seed), "--engine", "inprocess", *VARIANTS[variant]]
    if variant not in ("default (search)", "fedsim_attn (old default)"):  # both timed with their yardstick
        argv.append("--no-yardstick")
    if variant == "default (search)" and budget:
        argv += ["--budget", str(budget)]
    t0 = time.monotonic()
    code = fedsim(argv)
    seconds = time.monotonic() - t0
    row = {"seed": seed, "variant": variant, "seconds": seconds}
    return read_row(out / "runs" / name, row) if code == 0 else {**row, "failed": code}


def read_row(run: Path, row: dict) -> dict:
    """``row`` with what the finished run at ``run`` measured: its test and validation metrics,
    its yardstick, and its search's choice and scores where it searched."""
    summary = json.loads((run / "summary.json").read_text())
    row = {**row, "test": summary["test"], "val": summary["val"]}
    if (run / "yardstick.json").exists():
        row["yardstick"] = json.loads((run / "yardstick.json").read_text())
    if (run / "search.json").exists():
        search = json.loads((run / "search.json").read_text())
        row["chosen"] = search["chosen"]
        row["scores"] = {c["name"]: c["score"] for c in search["candidates"]}
    return row


def table(rows: list[dict], variants=tuple(VARIANTS), single: str = "fedsim_attn (old default)") -> list[str]:
    """The rows' table: each of ``variants`` and the yardstick's two, the default minus each paired
    over seeds, the search's choices and its time against ``single``'s run."""
    key = "rmse" if "rmse" in rows[0]["test"] else "accuracy"
    lower = key == "rmse"
    by = {(r["seed"], r["variant"]): r["test"][key] for r in rows if "test" in r}
    seeds = sorted({r["seed"] for r in rows})
    refs = {r["seed"]: r["yardstick"] for r in rows if "yardstick" in r}
    for s, y in refs.items():
        for field, what in (("primary_alone", "boosting, primary alone"), ("pooled", "pooled reference")):
            if isinstance(y.get(field), dict) and "test" in y[field]:
                by[(s, what)] = y[field]["test"]
    names = [*variants, "boosting, primary alone", "pooled reference"]
    out = [
        f"test {key} over seeds {seeds} (mean ± sd); default minus each, paired (mean ± sd; seeds the default is ahead, the same run, behind)"
    ]
    for name in names:
        vals = [by[(s, name)] for s in seeds if (s, name) in by]
        if not vals:
            continue
        line = f"  {name:38s} {statistics.mean(vals):9.4f} ± {statistics.pstdev(vals):7.4f}"
        pairs = [
            (by[(s, "default (search)")], by[(s, name)])
            for s in seeds
            if (s, name) in by and (s, "default (search)") in by
        ]
        if name != "default (search)" and pairs:
            diffs = [a - b for a, b in pairs]
            ahead = sum((a < b) if lower else (a > b) for a, b in pairs)
            same = sum(a == b for a, b in pairs)  # the same run: the search chose this candidate
            line += f"   diff {statistics.mean(diffs):+8.4f} ± {statistics.pstdev(diffs):7.4f}, ahead {ahead}, same {same}, behind {len(pairs) - ahead - same}"
        out.append(line)
    chosen = [f"s{r['seed']}: {r['chosen']}" for r in rows if r.get("chosen")]
    costs = {r["seed"]: r["seconds"] for r in rows if r["variant"] == "default (search)"}
    singles = {r["seed"]: r["seconds"] for r in rows if r["variant"] == single}
    ratio = [costs[s] / singles[s] for s in costs if s in singles]
    out.append(f"  chosen: {', '.join(chosen)}")
    if ratio:
        out.append(
            f"  default's time / one run's ({single}): {statistics.mean(ratio):.2f}x (per seed {[round(x, 2) for x in ratio]})"
        )
    return out


def fill_yardsticks(rows: list[dict], out: Path) -> int:
    """The boosted primary-alone and pooled reference of each default run that has none (its
    yardstick failed, or was skipped), computed now from the run's folder as `fedsim train` does
    (deterministic: the run's split, config and data); returns how many were filled."""
    from app.config import RunConfig  # lazy: the training stack, only when filling
    from fedsim import yardstick as ys  # lazy: scikit-learn, only when filling

    filled = 0
    for r in rows:
        if r["variant"] != "default (search)" or "yardstick" in r or "test" not in r:
            continue
        run = out / "runs" / f"s{r['seed']}-0"
        cfg = RunConfig.of(**json.loads((run / "config.json").read_text())["run"])
        r["yardstick"], r["yardstick_after"] = ys.measure(cfg, run), True
        filled += 1
    return filled


def run_rows(out: Path, seeds: str, variants: list[str], run: Callable[[int, str], dict]) -> list[dict]:
    """Every (seed, variant)'s row: those in ``out``/rows.jsonl, and ``run``'s for the rest, each
    appended to it as it finishes (an interrupted bench resumes)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "rows.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    done = {(r["seed"], r["variant"]) for r in rows if "test" in r}
    for seed in [int(s) for s in seeds.split(",")]:
        for variant in variants:
            if (seed, variant) in done:
                continue
            row = run(seed, variant)
            rows.append(row)
            with path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"[{time.strftime('%H:%M:%S')}] seed {seed} {variant}: {row.get('test', 'FAILED')}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--budget", type=int, default=None, help="the default variant's --budget (unset: its default)")
    ap.add_argument("--fill-yardsticks", action="store_true", help="compute missing yardsticks of the default runs")
    args = ap.parse_args(argv)
    rows = run_rows(
        args.out,
        args.seeds,
        list(VARIANTS),
        lambda seed, variant: run_one(args.data.resolve(), args.out.resolve(), seed, variant, args.budget),
    )
    path = args.out / "rows.jsonl"
    if args.fill_yardsticks and fill_yardsticks(rows, args.out.resolve()):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
