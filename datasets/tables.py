"""Turning a pandas frame into a :class:`PartyTable`, with clear errors for bad input."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from datasets.base import DatasetError, IdKind, PartyTable
from datasets.transform import fit_transform


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


def refuse_cells(bad: np.ndarray, cols: list[str], where: str, what: str, values: pd.DataFrame | None = None) -> None:
    """Refuse the cells flagged in ``bad`` (n, len(cols)), naming the first such column, an
    example value and its first rows; ``what`` says what is wrong with them."""
    if not bad.any():
        return
    flagged = np.flatnonzero(bad.any(axis=0))
    j = int(flagged[0])
    rows = np.flatnonzero(bad[:, j])
    example = f", e.g. {values.iloc[rows[0], j]!r}," if values is not None else ""
    also = f"; also in column(s) {[cols[i] for i in flagged[1:]]}" if len(flagged) > 1 else ""
    raise DatasetError(f"{where}: feature column {cols[j]!r} {what}{example} in {len(rows)} row(s) "
                       f"(first rows: {rows[:5].tolist()}){also}; fix or remove them")


def numeric_features(df: pd.DataFrame, cols: list[str], fit_rows: np.ndarray | None, where: str, *,
                     fill: tuple[float, ...] | None = None, with_fill: bool = False):
    """Numeric feature columns -> (n, len(cols)) float64, NaN replaced by ``fill`` (a fitted
    transform's) or else by the column's mean over ``fit_rows``; non-numbers and inf / -inf are
    refused, never coerced. Also returns the count of imputed NaN per column (columns without
    any left out) and, ``with_fill``, the fill values used."""
    raw = df[cols]
    num = raw.apply(pd.to_numeric, errors="coerce")
    refuse_cells(raw.notna().to_numpy() & num.isna().to_numpy(), cols, where, "holds non-numbers", raw)
    refuse_cells(np.isinf(num.to_numpy(dtype=np.float64)), cols, where, "holds non-finite values (inf/-inf)")
    if fill is None:
        mean = (num if fit_rows is None else num.iloc[fit_rows]).mean()
    else:
        mean = pd.Series(fill, index=cols, dtype=np.float64)
    missing = num.isna().sum()
    imputed = {c: int(missing.iloc[i]) for i, c in enumerate(cols) if missing.iloc[i] and not np.isnan(mean.iloc[i])}
    out = num.fillna(mean).to_numpy(dtype=np.float64)
    return (out, imputed, tuple(map(float, mean))) if with_fill else (out, imputed)


def drop_uninformative(x: np.ndarray, names: list[str], fit_rows: np.ndarray | None,
                       where: str) -> tuple[np.ndarray, dict]:
    """The columns of x (n, d) to keep: not those without any value on ``fit_rows`` (NaN there:
    nothing to impute from), nor those constant on them; refuse a party left with no column.
    Returns (keep (d,) bool, {"dropped_constant": [...], "dropped_empty": [...]})."""
    ref = x if fit_rows is None else x[fit_rows]
    empty = np.isnan(ref).any(axis=0)  # imputation filled every NaN of a column with any value
    constant = np.zeros(x.shape[1], dtype=bool)
    if len(ref) > 1:
        constant[~empty] = ref[:, ~empty].std(axis=0) == 0
    keep = ~empty & ~constant
    report = {"dropped_constant": [n for n, c in zip(names, constant) if c],
              "dropped_empty": [n for n, e in zip(names, empty) if e]}
    if not names:
        raise DatasetError(f"{where}: no feature column: a party needs at least one feature besides its "
                           "identifiers (and the primary's label)")
    if not keep.any():
        rows = "training rows" if fit_rows is not None else "rows"
        raise DatasetError(f"{where}: no feature column left: {report['dropped_constant']} are constant and "
                           f"{report['dropped_empty']} have no value on the {rows}; the party needs a feature "
                           "that varies")
    return keep, report
