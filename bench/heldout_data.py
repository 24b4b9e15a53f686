"""Writes a held-out own-data folder nobody here tuned on: the 1990 California census block groups
(../shared/data/california_housing) as two parties that share no key. The primary holds a sample
of block groups with the house-value label and what a sales register would know (age, rooms,
bedrooms, population, households); the secondary holds *other* block groups' median incomes and
sizes. A block group is linked by its coordinates to its neighbours' incomes (FedSim).

    python -m bench.heldout_data OUT [--task regression|binary|income] [--rows 2000] [--seed 0]

regression: median_house_value in k USD; binary: above the sample's median value; income: the
other way round, each block group's median income (k USD) from its own housing counts, linked to
its neighbours' house values.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from datasets.options import find_data_dir

SPEC = """task = "{task}"
label = "{label}"
metric = "euclidean"

[primary]
file = "blocks.csv"
identifiers = ["lat", "lon"]
kind = "numeric"
numeric = ["age", "rooms", "bedrooms", "population", "households"]

[secondaries.{party}]
file = "{party}.csv"
identifiers = ["latitude", "longitude"]
kind = "numeric"
numeric = "rest"
"""


def write_income(out: Path, prim: pd.DataFrame, sec: pd.DataFrame) -> None:
    own = {"age": "housing_median_age", "rooms": "total_rooms", "bedrooms": "total_bedrooms"}
    blocks = pd.DataFrame({"lat": prim["latitude"], "lon": prim["longitude"], **{k: prim[v] for k, v in own.items()}})
    blocks["population"], blocks["households"] = prim["population"], prim["households"]
    blocks["income"] = prim["median_income"] * 10.0  # the census' unit: 10 k USD
    blocks.to_csv(out / "blocks.csv", index=False)
    pd.DataFrame(
        {
            "latitude": sec["latitude"],
            "longitude": sec["longitude"],
            "house_value": sec["median_house_value"] / 1000.0,
            "households": sec["households"],
        }
    ).to_csv(out / "values.csv", index=False)
    (out / "parties.toml").write_text(SPEC.format(task="regression", label="income", party="values"))


def write(out: Path, task: str, rows: int, seed: int) -> None:
    src = find_data_dir("california_housing", None) / "cal_housing.csv.gz"
    df = pd.read_csv(src).sample(frac=1.0, random_state=seed).reset_index(drop=True)
    prim, sec = df.iloc[:rows], df.iloc[rows : 2 * rows]  # disjoint block groups
    if task == "income":
        out.mkdir(parents=True, exist_ok=True)
        return write_income(out, prim, sec)
    value = prim["median_house_value"] / 1000.0
    label = value if task == "regression" else (value > value.median()).astype(int)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(
        {
            "lat": prim["latitude"],
            "lon": prim["longitude"],
            "age": prim["housing_median_age"],
            "rooms": prim["total_rooms"],
            "bedrooms": prim["total_bedrooms"],
            "population": prim["population"],
            "households": prim["households"],
            "value": label,
        }
    ).to_csv(out / "blocks.csv", index=False)
    pd.DataFrame(
        {
            "latitude": sec["latitude"],
            "longitude": sec["longitude"],
            "median_income": sec["median_income"],
            "households": sec["households"],
            "house_age": sec["housing_median_age"],
        }
    ).to_csv(out / "incomes.csv", index=False)
    (out / "parties.toml").write_text(SPEC.format(task=task, label="value", party="incomes"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--task", choices=("regression", "binary", "income"), default="regression")
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    write(args.out, args.task, args.rows, args.seed)
    print(f"wrote {args.out}: {args.rows} primary and {args.rows} secondary block groups, task {args.task}")


if __name__ == "__main__":
    main()
