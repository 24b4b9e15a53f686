"""Datasets as vertically partitioned parties: one primary (labels) and named secondaries.

Every loader returns a :class:`VFLDataset`; :func:`load_dataset` is the one entry point
(``load_dataset("hdb", data_dir=...)``). The package name shadows Hugging Face
``datasets`` on purpose; nothing here depends on it.
"""

from datasets.base import DatasetError, PartyTable, Split, VFLDataset, split_primary
from datasets.registry import DATASETS, dataset_names, load_dataset

__all__ = [
    "DATASETS",
    "DatasetError",
    "PartyTable",
    "Split",
    "VFLDataset",
    "dataset_names",
    "load_dataset",
    "split_primary",
]
