"""The parties' tables from a RunConfig, for both training modes: every party of a simulation
and every engine start from the same loaded (and cached) dataset."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

from threadpoolctl import threadpool_limits

from app.config import RunConfig
from datasets.options import DatasetOptions

if TYPE_CHECKING:
    from datasets.base import VFLDataset


@functools.lru_cache(maxsize=4)
def _load(name: str, data_dir: str, options: DatasetOptions) -> VFLDataset:
    # A per-process cache of immutable data (not party state): in simulation one worker
    # serves every message, so each message does not re-read the CSVs.
    # numpy's OpenBLAS is held to one thread here: inside Flower's simulation process (a
    # thread of a Ray driver) its thread pool was seen to spin forever in exec_blas.
    from datasets.registry import load_dataset  # here: the loaders import pandas (and sklearn, scipy)

    with threadpool_limits(limits=1, user_api="blas"):
        return load_dataset(name, data_dir or None, options)


def load_data(cfg: RunConfig) -> VFLDataset:
    ds = _load(
        cfg.data.dataset,
        cfg.data.data_dir,
        dataset_options(cfg),
    )
    return with_parties(ds, cfg.party_subset())


def primary_data(cfg: RunConfig) -> VFLDataset:
    """The data the primary's side of a run reads (its ServerApp, predict, `fedsim train`'s check).
    With dataset csv and the linkage service's result (run-config ``linkage-dir``): parties.toml
    and its own CSV only, the secondaries by name (``VFLDataset.remote``), as a primary holding
    only its own data folder runs; otherwise, linking here, the whole dataset (:func:`load_data`)."""
    if cfg.data.dataset != "csv" or not cfg.link.linkage_dir:
        return load_data(cfg)
    ds = _load_primary_view(
        cfg.data.data_dir,
        dataset_options(cfg),
    )
    return with_parties(ds, cfg.party_subset())


def _primary_view(data_dir: str, options: DatasetOptions, matches: dict | None = None) -> VFLDataset:
    # one BLAS thread, as _load
    from datasets.csv_views import load_primary_view  # lazy: the loaders import pandas, as in _load

    with threadpool_limits(limits=1, user_api="blas"):
        return load_primary_view(data_dir or None, options, matches)


_load_primary_view = functools.lru_cache(maxsize=4)(_primary_view)  # cached as _load is (immutable data)


def matched_primary_data(cfg: RunConfig, matches: dict) -> VFLDataset:
    """The label holder's own file with its guests' rows from the parties' id exchange
    (``matches``: app/entity_aug/id_exchange.py), loaded as :func:`primary_data` loads (not cached:
    the matches are the exchange's)."""
    ds = _primary_view(cfg.data.data_dir, dataset_options(cfg), matches)
    return with_parties(ds, cfg.party_subset())


def with_parties(ds: VFLDataset, subset: list[str]) -> VFLDataset:
    """The dataset restricted to the secondaries named in run-config ``parties`` ("" = all)."""
    if not subset:
        return ds
    unknown = sorted(set(subset) - set(ds.party_names))
    if unknown:
        raise ValueError(
            f"run-config 'parties' names {unknown}, which dataset {ds.name!r} does not have; "
            f"its secondaries: {ds.party_names}"
        )
    if len(set(subset)) != len(subset):
        raise ValueError(f"run-config 'parties' names a party twice: {subset}")
    keep = sorted(subset)
    return dataclasses.replace(
        ds,
        secondaries={p: ds.secondaries[p] for p in keep if p in ds.secondaries},
        true_match={p: r for p, r in ds.true_match.items() if p in keep},
        remote=tuple(p for p in keep if p in ds.remote),
    )


def dataset_options(cfg: RunConfig) -> DatasetOptions:
    """What the run's loaders are given (part of a loaded dataset's cache key)."""
    d = cfg.data
    return DatasetOptions(
        seed=cfg.train.seed, n_rows=d.n_rows, sigma_cf=d.sigma_cf, recipe=d.recipe, search_fold=d.search_fold
    )
