"""Writes this example's two parties (sales.csv, listings.csv) from a fixed seed: a made-up city
whose house prices depend on how sought-after the neighbourhood is, which only the other party
(short-stay listings, priced by the same neighbourhoods) can tell. The parties share no key:
records are linked by their coordinates (FedSim).

    python examples/housing/make_data.py [OUT_FOLDER]   # default: this folder
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

SEED = 16
N_SALES, N_LISTINGS = 1200, 400
LAT, LON = (-37.90, -37.70), (144.80, 145.10)  # the city's box
HOTSPOTS = np.array([[-37.81, 144.96, 1.0], [-37.85, 145.02, 0.7], [-37.76, 144.88, 0.5]])  # lat, lon, weight


def appeal(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """(n,) how sought-after each place is: a sum of Gaussian bumps around the hotspots."""
    d2 = (lat[:, None] - HOTSPOTS[:, 0]) ** 2 + (lon[:, None] - HOTSPOTS[:, 1]) ** 2
    return (HOTSPOTS[:, 2] * np.exp(-d2 / (2 * 0.03**2))).sum(axis=1)


def places(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n coordinates: half around the hotspots, half anywhere in the box."""
    near = rng.integers(0, len(HOTSPOTS), n // 2)
    lat = np.concatenate([HOTSPOTS[near, 0] + rng.normal(0, 0.03, n // 2), rng.uniform(*LAT, n - n // 2)])
    lon = np.concatenate([HOTSPOTS[near, 1] + rng.normal(0, 0.03, n // 2), rng.uniform(*LON, n - n // 2)])
    return lat, lon


def listings(rng: np.random.Generator) -> pd.DataFrame:
    lat, lon = places(rng, N_LISTINGS)
    room = rng.choice(["entire home", "private room", "shared room"], N_LISTINGS, p=[0.6, 0.3, 0.1])
    price = 60 + 180 * appeal(lat, lon) + np.where(room == "entire home", 70, 0) + rng.normal(0, 15, N_LISTINGS)
    return pd.DataFrame(
        {
            "latitude": lat.round(5),
            "longitude": lon.round(5),
            "nightly_price": price.round(0).astype(int),
            "reviews": rng.poisson(25, N_LISTINGS),
            "room_type": room,
        }
    )


def sales(rng: np.random.Generator) -> pd.DataFrame:
    lat, lon = places(rng, N_SALES)
    rooms = rng.integers(1, 6, N_SALES)
    kind = rng.choice(["house", "unit", "townhouse"], N_SALES, p=[0.5, 0.3, 0.2])
    area = (40 + 35 * rooms + np.where(kind == "house", 120, 0) + rng.normal(0, 20, N_SALES)).round(0).astype(int)
    year = rng.integers(1900, 2020, N_SALES).astype(float)
    year[rng.random(N_SALES) < 0.05] = np.nan  # a few unknown: mean-imputed on the training rows
    price = 250 + 80 * rooms + 0.8 * area + 900 * appeal(lat, lon) + rng.normal(0, 40, N_SALES)  # thousands
    return pd.DataFrame(
        {
            "sale_id": [f"S{i:05d}" for i in range(N_SALES)],
            "lat": lat.round(5),
            "lon": lon.round(5),
            "rooms": rooms,
            "area": area,
            "type": kind,
            "year_built": year,
            "price": price.round(1),
        }
    )


def main(out: Path) -> None:
    rng = np.random.default_rng(SEED)
    out.mkdir(parents=True, exist_ok=True)
    listings(rng).to_csv(out / "listings.csv", index=False)
    sales(rng).to_csv(out / "sales.csv", index=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
