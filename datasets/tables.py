"""Turning a pandas frame into a :class:`PartyTable`, with clear errors for bad input."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from datasets.base import DatasetError, IdKind, PartyTable


def require_columns(df: pd.DataFrame, columns: Sequence[str], where: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DatasetError(f"{where}: missing column(s) {missing}; available: {list(df.columns)}")


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

    blocks, names = [], []
    if numeric_cols:
        num = df[list(numeric_cols)].apply(pd.to_numeric, errors="coerce")
        ref = num if fit_rows is None else num.iloc[fit_rows]
        num = num.fillna(ref.mean())
        blocks.append(num.to_numpy(dtype=np.float64))
        names += list(numeric_cols)
    for col in categorical_cols:
        dummies = pd.get_dummies(df[col].astype(str), prefix=col, dtype=np.float64)
        blocks.append(dummies.to_numpy())
        names += list(dummies.columns)
    x = np.concatenate(blocks, axis=1) if blocks else np.zeros((len(df), 0))
    ref = x if fit_rows is None else x[fit_rows]
    keep = ref.std(axis=0) > 0 if len(ref) > 1 else np.ones(x.shape[1], dtype=bool)
    x, names = x[:, keep], [n for n, k in zip(names, keep) if k]
    return PartyTable(
        name=name,
        features=standardize(x, fit_rows),
        feature_names=tuple(names),
        identifiers=ids,
        id_names=tuple(id_cols),
        id_kind=id_kind,
    )
