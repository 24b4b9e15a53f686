"""The named datasets: one explicit table from name to loader."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from datasets import csv_parties, frog, game, hdb, house, overlap, synthetic
from datasets.base import DatasetError, VFLDataset
from datasets.options import DatasetOptions, find_data_dir

__all__ = ["DATASETS", "DatasetOptions", "Loader", "data_folder", "dataset_names", "find_data_dir", "load_dataset"]

Loader = Callable[[Path | None, DatasetOptions], VFLDataset]

DATASETS: dict[str, Loader] = {
    "csv": csv_parties.load_csv_parties,
    "frog": frog.load_frog,
    "game": game.load_game,
    "hdb": hdb.load_hdb,
    "house": house.load_house,
    "house3": house.load_house3,
    "credit": overlap.load_credit,
    "parkinsons": overlap.load_parkinsons,
    "handwritten": overlap.load_handwritten,
    "digits": overlap.load_digits_halves,
    "synthetic": synthetic.load_synthetic,
}


# The folder of the data dir a dataset reads, where it is not the dataset's name ("": none, its
# data is generated, bundled or the user's own). An operator copying a dataset into a party's home
# copies this folder.
DATA_FOLDERS = {
    "house": "house_melbourne",
    "house3": "house_melbourne",
    "credit": "credit_default",
    "digits": "",
    "synthetic": "",
    "csv": "",
}


def data_folder(name: str) -> str:
    """The data dir's folder dataset ``name`` reads ("" where it reads none)."""
    return DATA_FOLDERS.get(name, name)


def dataset_names() -> list[str]:
    return sorted(DATASETS)


def load_dataset(name: str, data_dir: str | Path | None = None, options: DatasetOptions | None = None) -> VFLDataset:
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; known datasets: {sorted(DATASETS)}")
    return DATASETS[name](Path(data_dir) if data_dir else None, options or DatasetOptions())
