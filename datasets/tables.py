"""Turning a pandas frame into a :class:`PartyTable`, with clear errors for bad input."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from datasets.base import DatasetError, IdKind, PartyTable, require_columns
from datasets.transform import fit_transform


def check_identifiers(ids: np.ndarray, id_names: Sequence[str], where: str) -> None:
    """Refuse NaN / empty identifiers, naming the column and the first offending rows."""
    if ids.dtype.kind == "f":
        bad = np.isnan(ids) if ids.ndim == 1 else np.isnan(ids).any(axis=1)
    else:
        bad = pd.isna(ids) | (pd.Series(ids).astype(str).str.strip() == "").to_numpy()
    if bad.any():
        rows = np.flatnonzero(bad)
        raise DatasetError(
            f"{where}: {len(rows)} row(s) with NaN/empty identifiers {list(id_names)} "
            f"(first rows: {rows[:5].tolist()}); drop or fix them before linkage"
        )


def read_identifiers(df: pd.DataFrame, id_cols: Sequence[str], id_kind: IdKind, where: str) -> np.ndarray:
    """The identifier columns as linkage input: (n, d) float64 numbers or (n,) strings; refused by
    name when numbers are not numbers, a string kind names several columns, or one is NaN/empty."""
    if id_kind == "numeric":
        try:
            ids = df[list(id_cols)].to_numpy(dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise DatasetError(f"{where}: numeric identifiers {list(id_cols)} are not numbers ({exc})") from exc
    else:
        if len(id_cols) != 1:
            raise DatasetError(f"{where}: string identifiers need exactly one column, got {list(id_cols)}")
        ids = df[id_cols[0]].to_numpy(dtype=object)
    check_identifiers(ids, id_cols, where)
    return ids


def standardize(x: np.ndarray, fit_rows: np.ndarray | None = None) -> np.ndarray:
    """Z-score columns with mean/std of ``fit_rows`` (all rows if None); constant columns -> 0."""
    ref = x if fit_rows is None else x[fit_rows]
    mean = ref.mean(axis=0)
    std = ref.std(axis=0)
    std[std == 0] = 1.0
    return ((x - mean) / std).astype(np.float32)


def party_table(
    name: str,
    df: pd.DataFrame,
    *,
    id_cols: Sequence[str],
    id_kind: IdKind,
    numeric_cols: Sequence[str] = (),
    categorical_cols: Sequence[str] = (),
    fit_rows: np.ndarray | None = None,
) -> PartyTable:
    """Build a party table: identifiers kept apart from features, categoricals one-hot,
    numeric columns mean-imputed then standardised on ``fit_rows``, constant columns dropped."""
    where = f"party {name!r}"
    require_columns(df, [*id_cols, *numeric_cols, *categorical_cols], where)
    if len(df) == 0:
        raise DatasetError(f"{where}: zero rows")
    ids = read_identifiers(df, id_cols, id_kind, where)

    transform, report = fit_transform(df, list(numeric_cols), list(categorical_cols), fit_rows, where)
    features, _ = transform.apply(df, where)
    return PartyTable(
        name=name,
        features=features,
        feature_names=transform.names,
        identifiers=ids,
        id_names=tuple(id_cols),
        id_kind=id_kind,
        preprocessing=report,
        transform=transform,
    )
