"""What a loader is given: its options and where its data files are found (imports no loader)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from datasets.errors import DatasetError

SPEC = "parties.toml"  # a csv dataset's own spec file, beside its parties' CSVs (datasets/csv_parties.py)
SCALES = ("standard", "quantile", "ple")  # a party's input recipe for its numeric columns (datasets/transform.py)
# (each shipped dataset's own recipe: app/dataset_defaults.py)
MISSING = ("mean", "indicator")  # a numeric NaN: the training mean; or that plus a 0/1 "was missing" feature
PLE_BINS = 16  # bins per numeric column of the piecewise-linear encoding (at most: equal quantiles merge)
PLE_BINS_RANGE = (2, 256)


@dataclass(frozen=True)
class Recipe:
    """How a party turns its numeric columns into features, fitted on its own training rows
    (datasets/transform.py): the scale, how a NaN is filled, and the encoding's bins."""

    scale: str = "standard"  # SCALES
    missing: str = "mean"  # MISSING: "indicator" adds a 0/1 feature per numeric column with NaN on the fit rows
    ple_bins: int = PLE_BINS  # scale "ple": bins per numeric column, cut at its training quantiles

    def problems(self) -> list[str]:
        """What is wrong with this recipe, in words (empty: nothing)."""
        lo, hi = PLE_BINS_RANGE
        return [
            *([f"scale must be one of {list(SCALES)}, got {self.scale!r}"] if self.scale not in SCALES else []),
            *([f"missing must be one of {list(MISSING)}, got {self.missing!r}"] if self.missing not in MISSING else []),
            *(
                [f"ple_bins must be a whole number in [{lo}, {hi}], got {self.ple_bins!r}"]
                if type(self.ple_bins) is not int or not lo <= self.ple_bins <= hi
                else []
            ),
        ]


@dataclass(frozen=True)
class DatasetOptions:
    """Everything a loader may depend on; part of the cache key of a loaded dataset."""

    seed: int = 0
    n_rows: int = 0  # 0 = the dataset's full size (synthetic: 60,000)
    sigma_cf: float = 0.0  # Gaussian noise on the secondary's copy of the identifiers (synthetic, frog)
    recipe: Recipe = Recipe()  # every party's numeric input recipe (shipped datasets); csv: each in parties.toml
    search_fold: int = 0  # > 0: a recipe search's split, the real test rows unused (datasets/base.py split_primary)


def find_data_dir(subdir: str, data_dir: str | Path | None) -> Path:
    """The folder holding ``subdir``: the given data dir (only), else $FEDSIM_DATA_DIR, the repo's
    embedded ``data/`` or ``../shared/data`` beside it (repo, then working directory)."""
    repo = Path(__file__).resolve().parents[1]
    if data_dir:  # an explicit data dir is used or refused, never silently replaced
        given = Path(data_dir).expanduser().absolute()  # errors name the folder tried in full
        if (given / subdir).is_dir():
            return given / subdir
        raise DatasetError(f"data folder {subdir!r} not found in data-dir {str(given)!r}")
    candidates = []
    if os.environ.get("FEDSIM_DATA_DIR"):
        candidates.append(Path(os.environ["FEDSIM_DATA_DIR"]).expanduser().absolute())
    # the repo when run from a checkout; the working directory when run as an installed Flower app
    for root in dict.fromkeys([repo, Path.cwd()]):
        candidates += [root / "data", root.parent / "shared" / "data"]
    for base in candidates:
        if (base / subdir).is_dir():
            return base / subdir
    raise DatasetError(
        f"data folder {subdir!r} not found in {[str(c) for c in candidates]}; "
        "pass data-dir (run config) or set FEDSIM_DATA_DIR"
    )
