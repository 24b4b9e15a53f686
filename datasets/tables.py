"""Turning a pandas frame into a :class:`PartyTable`, with clear errors for bad input."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from datasets.base import DatasetError, IdKind, PartyTable, require_columns
from datasets.options import Recipe
from datasets.transform import FeatureTransform, fit_transform


def check_identifiers(ids: np.ndarray, id_names: Sequence[str], where: str) -> None:
    """Refuse NaN / empty identifiers, naming the columns, the first such column and rows."""
    if ids.dtype.kind == "f":
        cells = np.isnan(ids.reshape(len(ids), -1))  # (n, c)
    else:
        frame = pd.DataFrame(ids.reshape(len(ids), -1))
        cells = frame.isna().to_numpy() | (frame.astype(str).apply(lambda s: s.str.strip()) == "").to_numpy()
    bad = cells.any(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)
        column = list(id_names)[int(np.flatnonzero(cells.any(axis=0))[0])] if len(id_names) == cells.shape[1] else ""
        raise DatasetError(
            f"{where}: {len(rows)} row(s) with NaN/empty identifiers {list(id_names)} "
            f"({f'column {column!r}, ' if column else ''}first rows: {rows[:5].tolist()}); drop or fix them before linkage"
        )


def read_identifiers(df: pd.DataFrame, id_cols: Sequence[str], id_kind: IdKind, where: str) -> np.ndarray:
    """The identifier columns as linkage input: (n, d) float64 numbers, (n,) strings of one
    column or (n, c) strings of c columns; refused by name when numbers are not numbers or a
    value is NaN/empty."""
    if id_kind == "numeric":
        try:
            ids = df[list(id_cols)].to_numpy(dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise DatasetError(f"{where}: numeric identifiers {list(id_cols)} are not numbers ({exc})") from exc
    else:
        ids = df[list(id_cols)].to_numpy(dtype=object)  # (n, c)
        if len(id_cols) == 1:
            ids = ids[:, 0]  # (n,): one string per record, as the edit-distance linkage takes it
    check_identifiers(ids, id_cols, where)
    return ids


def standardize(x: np.ndarray, fit_rows: np.ndarray | None = None) -> np.ndarray:
    """Z-score columns with mean/std of ``fit_rows`` (all rows if None); constant columns -> 0."""
    ref = x if fit_rows is None else x[fit_rows]
    mean = ref.mean(axis=0)
    std = ref.std(axis=0)
    std[std == 0] = 1.0
    return ((x - mean) / std).astype(np.float32)


@dataclass(frozen=True)
class Columns:
    """A party file's columns by role: its identifiers (``kind`` "numeric" or "string"), its
    numeric and its categorical features."""

    ids: Sequence[str]
    kind: IdKind
    numeric: Sequence[str] = ()
    categorical: Sequence[str] = ()


def party_table(
    name: str,
    df: pd.DataFrame,
    columns: Columns,
    *,
    fit_rows: np.ndarray | None = None,
    labels_only: bool = False,
    recipe: Recipe = Recipe(),
) -> PartyTable:
    """Build a party table: identifiers kept apart from features, categoricals one-hot,
    numeric columns mean-imputed (``recipe.missing`` "indicator": plus a 0/1 feature per column
    with NaN; ``recipe.scale`` "quantile" / "ple": then mapped through their quantiles to a normal
    / encoded piecewise-linearly, datasets/transform.py) then standardised on ``fit_rows``, constant columns dropped.
    ``labels_only``: a label holder without any feature column is allowed (zero features)."""
    where = f"party {name!r}"
    id_cols, id_kind, numeric_cols, categorical_cols = columns.ids, columns.kind, columns.numeric, columns.categorical
    require_columns(df, [*id_cols, *numeric_cols, *categorical_cols], where)
    if len(df) == 0:
        raise DatasetError(f"{where}: zero rows")
    ids = read_identifiers(df, id_cols, id_kind, where)

    if labels_only and not numeric_cols and not categorical_cols:
        transform = FeatureTransform((), (), (), (), (), (), ())
        report = {"dropped_constant": [], "dropped_empty": [], "nan_imputed": {}, "nan_imputed_total": 0}
    else:
        transform, report = fit_transform(df, list(numeric_cols), list(categorical_cols), fit_rows, where, recipe)
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
