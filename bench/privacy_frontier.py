"""The privacy frontier per data set: what each level costs against what the attacks still get.

Joins two kinds of measured rows, nothing else:
- training rows of ``python -m experiments.exchange_table --defences none,standard,strict ...``
  (each run's test metric, the secondary's label attacks on the gradients it received, the
  primary's inversion of the secondary's features): per level the test metric, its paired
  difference to ``none`` (privacy off) over the seeds both have, and the attacks' means;
- release rows of ``python -m bench.privacy_defaults --out ...`` (the linkage release's attacks
  at each level through the service's own code: register identification from the similarities
  and from which records link a token, the location attacks, query averaging).

    python -m bench.privacy_frontier --training docs/privacy-levels-rows.jsonl [more.jsonl ...]
                                     --release docs/privacy-release-rows.jsonl

Where a (data set, level) appears in several training files the last file's rows count, all of
them (a re-measurement replaces the old one whole: seeds of two code versions never mix); within
a file a seed's last row counts. Rows of other defences are ignored. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

LEVEL_OF = {"none": "off", "standard": "standard", "strict": "strict"}  # exchange_table's defence -> level
LOCATION = ("greedy", "aggregation", "centroid")  # the release's location attacks (% within the radius)


def read_rows(paths: list[Path]) -> list[dict]:
    rows = []
    for path in paths:
        rows += [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
    return rows


def training(files: list[list[dict]]) -> dict[tuple[str, str], dict[int, dict]]:
    """(data set, level) -> seed -> its row, for the three levels' defences, each (data set,
    level) from the last file that has it."""
    out: dict[tuple[str, str], dict[int, dict]] = {}
    for rows in files:
        here: dict[tuple[str, str], dict[int, dict]] = {}
        for r in rows:
            if r["defence"] in LEVEL_OF:
                here.setdefault((r["dataset"], LEVEL_OF[r["defence"]]), {})[r["seed"]] = r
        out |= here
    return out


def release(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """(data set, level) -> the last release row (the first secondary's, in name order)."""
    out: dict[tuple[str, str], dict] = {}
    for r in sorted(rows, key=lambda r: r["secondary"], reverse=True):
        out[(r["data"], r["level"])] = r
    return out


def _mean(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f}" if values else "-"


def _spread(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def attack(row: dict, name: str) -> float | None:
    """The secondary's label attack ``name`` on the gradients it received (first secondary)."""
    return next(iter(row["exchange"]["attacks"].values())).get(name)


def level_line(data: str, level: str, runs: dict[int, dict], off: dict[int, dict], rel: dict | None) -> str:
    """One level's row: test, paired difference to off, label attacks, inversion, release attacks."""
    test = [r["test"] for r in runs.values()]
    digits = 4 if runs and next(iter(runs.values()))["metric"] != "rmse" else 2
    paired = [runs[s]["test"] - off[s]["test"] for s in sorted(runs) if s in off]
    diff = "" if level == "off" else f"{_spread(paired, digits)} ({len(paired)})"
    direction = [a for r in runs.values() if (a := attack(r, "direction")) is not None]
    inversion = [next(iter(r["inversion"].values())) for r in runs.values() if r.get("inversion")]
    cells = [data, level, f"{_spread(test, digits)} ({len(test)})", diff, _mean(direction), _mean(inversion)]
    if rel is None:
        cells += ["-"] * 4
    else:
        a = rel["attacks_pct"]
        located = max((a[k] for k in LOCATION if k in a), default=None)
        cells += [f"{a['membership']:.1f} %", f"{a['dictionary']:.1f} %"]
        cells += [
            "-" if located is None else f"{located:.1f} %",
            f"{rel['averaging_radii']:.2f}" if "averaging_radii" in rel else "-",
        ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| data | level | test (mean ± sd, seeds) | against off, paired | label attack (direction) | "
    "inversion error ratio | register named: who links it | register named: similarities | "
    "best location attack within the radius | query averaging: median error, radii |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def frontier(train_files: list[list[dict]], release_rows: list[dict]) -> str:
    """The table of the training files' rows (in order: a later file's level replaces an earlier one's) and the release's."""
    runs, rel = training(train_files), release(release_rows)
    datasets = sorted({d for d, _ in runs} | {d for d, _ in rel})
    lines = [HEADER]
    for data in datasets:
        off = runs.get((data, "off"), {})
        for level in ("off", "standard", "strict"):
            if (data, level) in runs or (data, level) in rel:
                lines.append(level_line(data, level, runs.get((data, level), {}), off, rel.get((data, level))))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--training", type=Path, nargs="+", default=[], help="experiments.exchange_table rows (jsonl)")
    ap.add_argument("--release", type=Path, nargs="*", default=[], help="bench.privacy_defaults --out rows (jsonl)")
    args = ap.parse_args(argv)
    print(frontier([read_rows([path]) for path in args.training], read_rows(args.release)))


if __name__ == "__main__":
    main()
