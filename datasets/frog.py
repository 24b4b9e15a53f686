"""UCI Anuran calls (frog), split vertically like the paper: 16 of the 22 MFCCs are
common (noisy on the secondary side), the remaining 6 split 3 / 3 between the parties."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from datasets.base import VFLDataset, split_primary
from datasets.options import DatasetOptions, find_data_dir
from datasets.tables import Columns, party_table, require_columns

N_IDENTIFIERS = 16


def load_frog(data_dir: Path | None, opts: DatasetOptions) -> VFLDataset:
    df = pd.read_csv(find_data_dir("frog", data_dir) / "Frogs_MFCCs.csv.gz")
    mfcc = [c for c in df.columns if c.startswith("MFCCs")]
    require_columns(df, ["Species"], "frog")
    if opts.n_rows:
        df = df.sample(n=min(opts.n_rows, len(df)), random_state=opts.seed).reset_index(drop=True)
    rng = np.random.default_rng([opts.seed, 2])
    cols = rng.permutation(mfcc)
    id_cols, p_cols, s_cols = list(cols[:N_IDENTIFIERS]), list(cols[N_IDENTIFIERS:19]), list(cols[19:])
    n = len(df)
    split = split_primary(n, opts.seed, fold=opts.search_fold)
    classes, y = np.unique(df["Species"].to_numpy(), return_inverse=True)

    order = rng.permutation(n)
    s_df = df.iloc[order].reset_index(drop=True)
    if opts.sigma_cf > 0:
        s_df[id_cols] = s_df[id_cols] + rng.normal(0.0, opts.sigma_cf, size=(n, len(id_cols)))
    primary = party_table(
        "primary", df, Columns(id_cols, "numeric", numeric=p_cols), fit_rows=split.train, recipe=opts.recipe
    )
    secondary = party_table("secondary", s_df, Columns(id_cols, "numeric", numeric=s_cols), recipe=opts.recipe)
    return VFLDataset(
        name="frog",
        task="multiclass",
        primary=primary,
        labels=y.astype(np.int64),
        secondaries={"secondary": secondary},
        split=split,
        n_classes=len(classes),
        label_name="Species",
        true_match={"secondary": np.argsort(order)},
    )
