"""Datasets as vertically partitioned parties: one primary (labels) and named secondaries.

Every loader returns a :class:`VFLDataset`; :func:`load_dataset` is the one entry point
(``load_dataset("hdb", data_dir=...)``). The package name shadows Hugging Face
``datasets`` on purpose; nothing here depends on it.
"""

import importlib

# Exports resolved on first use (PEP 562): a process that needs no dataset (a deployed
# secondary's message, with its features cached) imports no loader, pandas or sklearn.
_EXPORTS = {
    **dict.fromkeys(["DatasetError", "PartyTable", "Split", "VFLDataset", "split_primary"], "datasets.base"),
    **dict.fromkeys(["DATASETS", "dataset_names", "load_dataset"], "datasets.registry"),
}

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


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'datasets' has no attribute {name!r}")
