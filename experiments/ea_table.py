"""The Entity Augmentation overlap table from a finished sweep's results.csv:
per dataset and overlap x, test accuracy (mean ± std over seeds) of (a) the aligned subset only,
(b) aligned + Entity Augmentation on the misaligned rest, (c) every training entity aligned.

    python -m experiments.sweep conf/sweeps/entity_aug.toml     # the runs
    python -m experiments.ea_table [runs/sweeps/entity_aug]     # this table (markdown on stdout)

Variant names follow conf/sweeps/entity_aug.toml: aligned-<x>, augment-<x>, full; at x = 100
(a) is the same run as (c).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from experiments.runner import REPO

OVERLAPS = (5, 10, 100)


def load(results: Path) -> dict[tuple[str, str], list[float]]:
    acc: dict[tuple[str, str], list[float]] = defaultdict(list)
    with results.open() as f:
        for row in csv.DictReader(f):
            acc[(row["dataset"], row["variant"])].append(float(row["test"]))
    return acc


def cell(values: list[float]) -> str:
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4f} ± {sd:.4f}"


def table(acc: dict[tuple[str, str], list[float]]) -> str:
    datasets = list(dict.fromkeys(d for d, _ in acc))
    lines = [
        "| dataset | x | (a) aligned only | (b) aligned + EA | (c) fully aligned | (b) − (a) | seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in datasets:
        full = acc.get((d, "full"), [])
        for x in OVERLAPS:
            a = full if x == 100 else acc.get((d, f"aligned-{x}"), [])
            b = acc.get((d, f"augment-{x}"), [])
            gap = f"{statistics.fmean(b) - statistics.fmean(a):+.4f}" if a and b else "–"
            lines.append(
                f"| {d} | {x}% | {cell(a)} | {cell(b)} | {cell(full)} | {gap} | {min(len(a), len(b)) or '–'} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path, nargs="?", default=REPO / "runs" / "sweeps" / "entity_aug")
    args = ap.parse_args()
    results = args.root / "results.csv"
    if not results.is_file():
        print(f"error: {results} does not exist: run the sweep first (or name its folder)", file=sys.stderr)
        raise SystemExit(2)
    print(table(load(results)))


if __name__ == "__main__":
    main()
