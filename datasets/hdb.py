"""Singapore HDB resale flats (2012-03 .. 2016-12) linked by GPS to 165 primary schools.

Primary: resale transactions joined on block + street to block coordinates; label
resale_price in thousands SGD. Features: floor area, lease start, storey (mid-point),
sale time, and one-hot town / flat type / flat model. lat/lon are identifiers only.
Secondary "school": vacancy rates (n_places_* are constant in the source: dropped).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from datasets.base import DatasetError, VFLDataset, split_primary
from datasets.options import DatasetOptions, find_data_dir
from datasets.tables import Columns, party_table, require_columns

RESALE_FILES = ("resale-2012-03_2014-12.csv.gz", "resale-2015-01_2016-12.csv.gz")
RESALE_COLS = [
    "month",
    "town",
    "flat_type",
    "block",
    "street_name",
    "storey_range",
    "floor_area_sqm",
    "flat_model",
    "lease_commence_date",
    "resale_price",
]


def load_flats(folder: Path) -> pd.DataFrame:
    frames = []
    for name in RESALE_FILES:
        df = pd.read_csv(folder / name)
        require_columns(df, RESALE_COLS, f"hdb file {name}")
        frames.append(df[RESALE_COLS])
    flats = pd.concat(frames, ignore_index=True)
    coords = pd.read_csv(folder / "block_coordinates.csv.gz")
    require_columns(coords, ["address", "latitude", "longitude"], "hdb block_coordinates")
    flats["address"] = flats["block"].astype(str).str.strip() + " " + flats["street_name"].str.strip()
    flats = flats.merge(coords.drop_duplicates("address"), on="address", how="inner", validate="m:1")
    if flats.empty:
        raise DatasetError("hdb: no resale row joined to block_coordinates on block + street")
    lo_hi = flats["storey_range"].str.extract(r"(\d+)\s*TO\s*(\d+)").astype(float)
    flats["storey"] = lo_hi.mean(axis=1)
    month = pd.to_datetime(flats["month"], format="%Y-%m")
    flats["sale_time"] = month.dt.year + (month.dt.month - 1) / 12.0
    return flats


def load_hdb(data_dir: Path | None, opts: DatasetOptions) -> VFLDataset:
    folder = find_data_dir("hdb", data_dir)
    flats = load_flats(folder)
    if opts.n_rows:
        flats = flats.sample(n=min(opts.n_rows, len(flats)), random_state=opts.seed).reset_index(drop=True)
    split = split_primary(len(flats), opts.seed, fold=opts.search_fold)
    primary = party_table(
        "primary",
        flats,
        Columns(
            ["latitude", "longitude"],
            "numeric",
            numeric=["floor_area_sqm", "lease_commence_date", "storey", "sale_time"],
            categorical=["town", "flat_type", "flat_model"],
        ),
        fit_rows=split.train,
        recipe=opts.recipe,
    )
    schools = pd.read_csv(folder / "schools.csv")
    school = party_table(
        "school",
        schools,
        Columns(["lat", "lon"], "numeric", numeric=[f"vacancy_rate_{i}" for i in range(4)]),
        recipe=opts.recipe,
    )
    return VFLDataset(
        name="hdb",
        task="regression",
        primary=primary,
        labels=(flats["resale_price"].to_numpy(dtype=np.float64) / 1000.0).astype(np.float32),
        secondaries={"school": school},
        split=split,
        label_name="resale_price (k SGD)",
    )
