"""What a loader is given: its options and where its data files are found (imports no loader)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from datasets.base import DatasetError

SCALES = ("standard", "quantile", "ple")  # a party's input recipe for its numeric columns (datasets/transform.py)
# The recipe each shipped dataset's parties use unless the run config names one: chosen on
# validation (docs/fedsim-attn.md "Piecewise-linear encodings": ple better on both seeds of all four).
DATASET_SCALES = {"hdb": "ple", "house": "ple", "game": "ple", "frog": "ple"}
MISSING = ("mean", "indicator")  # a numeric NaN: the training mean; or that plus a 0/1 "was missing" feature
# The shipped datasets whose parties add the indicator unless the run config says (none yet).
DATASET_MISSING: dict[str, str] = {}


@dataclass(frozen=True)
class DatasetOptions:
    """Everything a loader may depend on; part of the cache key of a loaded dataset."""

    seed: int = 0
    n_rows: int = 0  # 0 = the dataset's full size (synthetic: 60,000)
    sigma_cf: float = 0.0  # Gaussian noise on the secondary's copy of the identifiers (synthetic, frog)
    scale: str = "standard"  # every party's numeric input recipe (datasets/transform.py SCALES); csv: parties.toml
    missing: str = "mean"  # MISSING: "indicator" adds a 0/1 feature per numeric column with NaN on the fit rows


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
