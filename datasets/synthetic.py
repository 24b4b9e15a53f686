"""The paper's "sklearn" set: make_classification split into two row-aligned parties.

The reference chose the 5 common identifiers as "the first columns", but
make_classification shuffles columns by default, so its identifiers were mostly noise
features. Here shuffle=False keeps the 20 informative features in columns 0..19 and the
identifiers are drawn from those; the secondary gets a copy with N(0, sigma_cf) noise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from datasets.base import VFLDataset, split_primary
from datasets.options import DatasetOptions
from datasets.tables import Columns, party_table

N_ROWS = 60_000
N_FEATURES = 95  # 5 common + 45 per party (paper Table 4: 50 per party incl. identifiers)
N_INFORMATIVE = 20
N_IDENTIFIERS = 5


def load_synthetic(data_dir: Path | None, opts: DatasetOptions) -> VFLDataset:
    from sklearn.datasets import make_classification  # here: importing sklearn costs every process ~1 s

    n = opts.n_rows or N_ROWS
    x, y = make_classification(
        n_samples=n,
        n_features=N_FEATURES,
        n_informative=N_INFORMATIVE,
        n_redundant=0,
        n_clusters_per_class=3,
        class_sep=0.3,
        shuffle=False,  # informative features stay in columns 0..19
        random_state=opts.seed,
    )
    rng = np.random.default_rng([opts.seed, 1])
    id_cols = rng.choice(N_INFORMATIVE, size=N_IDENTIFIERS, replace=False)
    rest = rng.permutation(np.setdiff1d(np.arange(N_FEATURES), id_cols))
    p_cols, s_cols = np.sort(rest[: len(rest) // 2]), np.sort(rest[len(rest) // 2 :])

    ids = x[:, id_cols]
    ids_s = ids + rng.normal(0.0, opts.sigma_cf, size=ids.shape) if opts.sigma_cf > 0 else ids.copy()
    order = rng.permutation(n)  # the secondary's rows are in its own order
    split = split_primary(n, opts.seed, fold=opts.search_fold)

    id_names = [f"k{i}" for i in range(N_IDENTIFIERS)]
    p_df = pd.DataFrame(np.c_[x[:, p_cols], ids], columns=[f"p{c}" for c in p_cols] + id_names)
    s_df = pd.DataFrame(np.c_[x[order][:, s_cols], ids_s[order]], columns=[f"s{c}" for c in s_cols] + id_names)
    primary = party_table(
        "primary",
        p_df,
        Columns(id_names, "numeric", numeric=[f"p{c}" for c in p_cols]),
        fit_rows=split.train,
        recipe=opts.recipe,
    )
    secondary = party_table(
        "secondary", s_df, Columns(id_names, "numeric", numeric=[f"s{c}" for c in s_cols]), recipe=opts.recipe
    )
    return VFLDataset(
        name="synthetic",
        task="binary",
        primary=primary,
        labels=y.astype(np.int64),
        secondaries={"secondary": secondary},
        split=split,
        n_classes=2,
        true_match={"secondary": np.argsort(order)},
    )
