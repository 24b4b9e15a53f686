"""Melbourne house sales (labels) <- lat/lon -> Melbourne Airbnb listings (stand-in for the paper's
Beijing house <- Airbnb pair).

Primary "sales" (13,580 sales, those with coordinates): label = price in thousands AUD.
Features: rooms, type, method, sale date, bedrooms, bathrooms, car spots, land size, building
area, year built, and the region (8 coarse regions, like the paper's districts). Suburb, postcode,
address, council area and distance to the CBD are left out: they encode the location exactly
(../shared/docs/datasets-notes.md). Secondary "airbnb": nightly price, reviews, availability,
bedrooms, beds, baths, rating (coerced to numbers). Identifiers: latitude / longitude.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from datasets.base import VFLDataset, split_primary
from datasets.options import DatasetOptions, find_data_dir
from datasets.tables import Columns, party_table, require_columns

SALES_NUM = ["Rooms", "Bedroom2", "Bathroom", "Car", "Landsize", "BuildingArea", "YearBuilt", "sale_time"]
SALES_CAT = ["Type", "Method", "Regionname"]
BNB_NUM = [
    "price",
    "minimum_nights",
    "number_of_reviews",
    "reviews_per_month",
    "availability_365",
    "rating",
    "number_of_bedrooms",
    "number_of_beds",
    "number_of_baths",
]


def load_house(data_dir: Path | None, opts: DatasetOptions) -> VFLDataset:
    return _load(data_dir, opts, {"airbnb": BNB_NUM})


# Paper App. F.3: the secondary's features split equally into three parties (same listings,
# same coordinates), for multi-party runs and every subset of parties.
HOUSE3_PARTIES = {"airbnb_a": BNB_NUM[0:3], "airbnb_b": BNB_NUM[3:6], "airbnb_c": BNB_NUM[6:9]}


def load_house3(data_dir: Path | None, opts: DatasetOptions) -> VFLDataset:
    return _load(data_dir, opts, HOUSE3_PARTIES, name="house3")


def _load(
    data_dir: Path | None, opts: DatasetOptions, parties: dict[str, list[str]], name: str = "house"
) -> VFLDataset:
    folder = find_data_dir("house_melbourne", data_dir)
    sales = pd.read_csv(folder / "sales.csv.gz")
    require_columns(
        sales, ["Price", "Date", "Lattitude", "Longtitude", *SALES_NUM[:-1], *SALES_CAT], "house sales.csv.gz"
    )
    sales = sales.dropna(subset=["Lattitude", "Longtitude", "Price"]).reset_index(drop=True)
    if opts.n_rows:
        sales = sales.sample(n=min(opts.n_rows, len(sales)), random_state=opts.seed).reset_index(drop=True)
    date = pd.to_datetime(sales["Date"], dayfirst=True, errors="coerce")
    sales["sale_time"] = date.dt.year + (date.dt.month - 1) / 12.0
    split = split_primary(len(sales), opts.seed, fold=opts.search_fold)
    primary = party_table(
        "sales",
        sales,
        Columns(["Lattitude", "Longtitude"], "numeric", numeric=SALES_NUM, categorical=SALES_CAT),
        fit_rows=split.train,
        recipe=opts.recipe,
    )
    bnb = pd.read_csv(folder / "airbnb_listings.csv.gz")
    require_columns(bnb, ["latitude", "longitude", *BNB_NUM], "house airbnb_listings.csv.gz")
    bnb = bnb.dropna(subset=["latitude", "longitude"]).reset_index(drop=True)
    for col in BNB_NUM:
        bnb[col] = pd.to_numeric(bnb[col].astype(str).str.replace(r"[^0-9.\-]", "", regex=True), errors="coerce")
    secondaries = {
        party: party_table(party, bnb, Columns(["latitude", "longitude"], "numeric", numeric=cols), recipe=opts.recipe)
        for party, cols in parties.items()
    }
    return VFLDataset(
        name=name,
        task="regression",
        primary=primary,
        labels=(sales["Price"].to_numpy(dtype=np.float64) / 1000.0).astype(np.float32),
        secondaries=secondaries,
        split=split,
        label_name="price (k AUD)",
    )
