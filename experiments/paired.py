"""Paired tables: one variant against the others, paired by seed, from a sweep's results.csv
(and the gradient-boosting reference of experiments/reference.py, if it ran on the same seeds).

    python -m experiments.paired runs/sweeps/attn_game/results.csv --ours fedsim_attn \
        [--reference runs/reference/game.csv]

Prints a markdown table: per variant the test metric (mean ± std), the validation metric, and our
variant minus it per seed (positive = ours better, for RMSE too), with how many seeds ours wins.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from pathlib import Path

LOWER_IS_BETTER = ("rmse",)


def read(
    path: Path, variant: str | None = None, dataset: str | None = None, config: str | None = None
) -> dict[str, dict[int, dict]]:
    """{variant: {seed: row}} of ``dataset``'s rows (None: all, for a one-dataset file); a
    reference csv's rows become variant ``variant``, only those whose run config is ``config``
    (None: any; a reference csv holds every configuration it ran, e.g. both sigma_cf levels)."""
    table: dict[str, dict[int, dict]] = defaultdict(dict)
    with path.open() as f:
        for row in csv.DictReader(f):
            if config is not None and row.get("config", "") != config:
                continue
            if dataset is None or row["dataset"] == dataset:
                table[variant or row["variant"]][int(row["seed"])] = row  # a later row (a rerun) wins
    return table


def render(table: dict[str, dict[int, dict]], ours: str) -> str:
    metric = next(iter(table[ours].values()))["metric"]
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
    seeds = sorted(table[ours])
    lines = [
        f"| variant | test {metric} | val {metric} | {ours} minus it, per seed {seeds} | {ours} better in |",
        "|---|---|---|---|---|",
    ]
    for variant, runs in table.items():
        test = [float(r["test"]) for r in runs.values()]
        val = [float(r["val"]) for r in runs.values()]
        common = [s for s in seeds if s in runs]
        diff = [sign * (float(table[ours][s]["test"]) - float(runs[s]["test"])) for s in common]
        spread = statistics.stdev(test) if len(test) > 1 else 0.0
        cells = ", ".join(f"{d:+.4f}" for d in diff) if variant != ours else "-"
        wins = f"{sum(d > 0 for d in diff)} of {len(diff)}" if variant != ours else "-"
        lines.append(
            f"| {variant} | {statistics.mean(test):.4f} ± {spread:.4f} ({len(test)}) | "
            f"{statistics.mean(val):.4f} | {cells} | {wins} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m experiments.paired", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("results", type=Path, nargs="+")
    ap.add_argument("--ours", default="fedsim_attn")
    ap.add_argument("--reference", type=Path, help="experiments/reference.py's csv for the same dataset")
    ap.add_argument(
        "--reference-config",
        default=None,
        help="only the reference rows of this run config, as its csv writes it (e.g. 'n-rows=60000 sigma-cf=0.4')",
    )
    ap.add_argument("--dataset", help="only this dataset's rows of the sweeps' results.csv")
    args = ap.parse_args(argv)
    table: dict[str, dict[int, dict]] = defaultdict(dict)
    for path in args.results:
        for variant, runs in read(path, dataset=args.dataset).items():
            table[variant].update(runs)
    if args.reference:
        reference = read(args.reference, "gradient boosting (not federated)", config=args.reference_config)
        if not reference:
            raise SystemExit(
                f"--reference {args.reference}: no rows"
                + (f" with config {args.reference_config!r}" if args.reference_config is not None else "")
            )
        table.update(reference)
    if args.ours not in table:
        raise SystemExit(f"no runs of variant {args.ours!r} in {[str(p) for p in args.results]}")
    print(render({v: r for v, r in table.items() if r}, args.ours))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
