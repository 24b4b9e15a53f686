"""A party's feature preparation as a fitted, serialisable object: how raw columns become the
model's features (numeric imputation, one-hot categories, dropped columns, standardisation),
fitted once and applied alike to the training frame and to new records (predict).

    fit_transform(df, numeric, categorical, fit_rows, where) -> FeatureTransform
    FeatureTransform.apply(df, where) -> (features (n, d) float32, report)

Training builds its features with ``apply`` on the frame it was fitted on, so new records go
through the very same arithmetic (tests/test_transform.py: apply == training features, bitwise).
New records: a missing column or a non-number is refused by name; NaN in a numeric column is
filled with the training mean (counted in the report, as in training); a category not seen in
training sets none of that column's one-hot features (scikit-learn's handle_unknown="ignore"),
counted per column in the report, or is refused with ``unknown="refuse"``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from datasets.errors import DatasetError, require_columns
from datasets.options import PLE_BINS, Recipe


@dataclass(frozen=True)
class FeatureTransform:
    numeric: tuple[str, ...]  # numeric source columns, in feature order
    fill: tuple[float, ...]  # per numeric column: the training mean that fills its NaN
    categorical: tuple[tuple[str, tuple[str, ...]], ...]  # (column, its categories as str), one-hot in this order
    kept: tuple[int, ...]  # indices of the (numeric + one-hot) columns kept as features
    mean: tuple[float, ...]  # per kept feature: standardisation on the fit rows
    std: tuple[float, ...]
    names: tuple[str, ...]  # per kept feature
    # per numeric column its training quantiles (scale "quantile": mapped to a normal before the
    # standardisation; scikit-learn's QuantileTransformer); () = scale "standard"
    quantiles: tuple[tuple[float, ...], ...] = ()
    # per numeric column its piecewise-linear encoding's bin edges (scale "ple": each column becomes
    # one feature per bin, :func:`to_ple`); () = not this recipe
    ple: tuple[tuple[float, ...], ...] = ()
    # positions in ``numeric`` of the columns that had NaN on the fit rows and get a 0/1 "was
    # missing" feature each, after the numeric block (recipe missing = "indicator"); () = none
    indicate: tuple[int, ...] = ()

    @property
    def columns(self) -> list[str]:
        """The source columns a frame must hold to be transformed."""
        return [*self.numeric, *(c for c, _ in self.categorical)]

    def apply(self, df: pd.DataFrame, where: str, unknown: str = "ignore") -> tuple[np.ndarray, dict]:
        """Features (n, d) float32 of ``df``'s rows, and a report of what was filled or unseen."""
        require_columns(df, self.columns, where)
        blocks, report = [], {"nan_imputed": {}, "unseen_categories": {}}
        if self.numeric:
            num, report["nan_imputed"], _ = numeric_features(df, list(self.numeric), None, where, fill=self.fill)
            blocks.append(
                to_ple(num, self.ple) if self.ple else to_normal(num, self.quantiles) if self.quantiles else num
            )
            if self.indicate:
                blocks.append(was_missing(df, [self.numeric[j] for j in self.indicate]))
        for col, cats in self.categorical:
            onehot, unseen = one_hot(df[col], cats)
            if unseen and unknown == "refuse":
                raise DatasetError(
                    f"{where}: column {col!r} holds {unseen} value(s) not seen in training, "
                    f"e.g. {_first_unseen(df[col], cats)!r}; known: {list(cats)[:10]}"
                )
            if unseen:
                report["unseen_categories"][col] = unseen
            blocks.append(onehot)
        x = np.concatenate(blocks, axis=1) if blocks else np.zeros((len(df), 0))
        x = x[:, list(self.kept)]
        return ((x - np.asarray(self.mean)) / np.asarray(self.std)).astype(np.float32), report

    def unseen(self, df: pd.DataFrame) -> list[tuple[str, np.ndarray, str]]:
        """Per categorical column with a value not seen in training: (column, rows (n,) bool, what)."""
        out = []
        for col, cats in self.categorical:
            rows = ~_as_text(df[col], cats).isin(cats).to_numpy()
            if rows.any():
                out.append((col, rows, "is a category not seen in training"))
        return out

    def to_json(self) -> str:
        """Strict JSON: a fill of NaN (a column without any training value, dropped) is null."""
        d = asdict(self)
        d["fill"] = [None if np.isnan(v) else v for v in self.fill]
        return json.dumps(d, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> FeatureTransform:
        d = json.loads(text)
        d["categorical"] = tuple((c, tuple(v)) for c, v in d["categorical"])
        d["fill"] = [float("nan") if v is None else v for v in d["fill"]]
        d["quantiles"] = tuple(tuple(q) for q in d.get("quantiles", ()))  # absent in runs kept before it
        d["ple"] = tuple(tuple(e) for e in d.get("ple", ()))  # likewise
        d["indicate"] = tuple(d.get("indicate", ()))  # likewise
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def one_hot(values: pd.Series, cats: tuple[str, ...]) -> tuple[np.ndarray, int]:
    """(n, len(cats)) float64 one-hot of ``values`` as str over ``cats``; and the number of values
    outside ``cats`` (their rows are all zero)."""
    codes = pd.Categorical(_as_text(values, cats), categories=list(cats)).codes  # -1 = not a category
    out = np.zeros((len(values), len(cats)))
    rows = np.flatnonzero(codes >= 0)
    out[rows, codes[rows]] = 1.0
    return out, int((codes < 0).sum())


def _as_text(values: pd.Series, cats: tuple[str, ...]) -> pd.Series:
    """Category values as the text training saw. A column of whole numbers read as floats (a
    CSV with a blank cell makes 2 read as 2.0) is matched as "2" when training saw "2"."""
    text = values.astype(str)
    if pd.api.types.is_float_dtype(values):
        whole = values.notna() & (values == values.round())
        as_int = values[whole].astype("int64").astype(str)
        use = whole & ~text.isin(cats)
        text[use] = as_int[use[whole].to_numpy()]
    return text


def _first_unseen(values: pd.Series, cats: tuple[str, ...]) -> str:
    known = set(cats)
    return next(v for v in _as_text(values, cats) if v not in known)


def quantile_grid(num: np.ndarray, fit_rows: np.ndarray | None) -> tuple[tuple[float, ...], ...]:
    """Per column of ``num`` (n, d) its quantiles on ``fit_rows`` (at most 1,000 levels)."""
    from sklearn.preprocessing import QuantileTransformer  # lazy: only this recipe needs it

    ref = num if fit_rows is None else num[fit_rows]
    qt = QuantileTransformer(n_quantiles=min(1000, len(ref)), subsample=None).fit(ref)
    return tuple(tuple(map(float, col)) for col in qt.quantiles_.T)


def to_normal(num: np.ndarray, quantiles: tuple[tuple[float, ...], ...]) -> np.ndarray:
    """``num`` (n, d) mapped through each column's training quantiles to a standard normal
    (scikit-learn's QuantileTransformer with the fitted quantiles set, so training and predict
    run the same code)."""
    from sklearn.preprocessing import QuantileTransformer  # lazy: only this recipe needs it

    grid = np.asarray(quantiles, dtype=np.float64).T  # (Q, d)
    qt = QuantileTransformer(n_quantiles=len(grid), output_distribution="normal")
    qt.quantiles_, qt.references_, qt.n_features_in_ = grid, np.linspace(0, 1, len(grid)), grid.shape[1]
    return qt.transform(num)


def ple_edges(num: np.ndarray, fit_rows: np.ndarray | None, bins: int = PLE_BINS) -> tuple[tuple[float, ...], ...]:
    """Per column of ``num`` (n, d) the distinct training quantiles at 0, 1/T, ..., 1 (T =
    ``bins``): its bins' edges (a constant column has one edge, hence no bin)."""
    ref = num if fit_rows is None else num[fit_rows]
    q = np.quantile(ref, np.linspace(0, 1, bins + 1), axis=0)  # (T + 1, d)
    return tuple(tuple(map(float, np.unique(col))) for col in q.T)


def to_ple(num: np.ndarray, edges: tuple[tuple[float, ...], ...]) -> np.ndarray:
    """Piecewise-linear encoding (Gorishniy et al., NeurIPS 2022): ``num`` (n, d) -> (n, sum of
    the columns' bins); per column and bin t with edges b_t-1 < b_t, (x - b_t-1) / (b_t - b_t-1)
    clipped to [0, 1], except that the first bin is not clipped below and the last not above
    (new values outside the training range extrapolate linearly)."""
    out = []
    for j, col in enumerate(edges):
        b = np.asarray(col)
        if len(b) < 2:
            continue
        e = (num[:, j : j + 1] - b[:-1]) / (b[1:] - b[:-1])  # (n, T_j)
        lo = np.full(len(b) - 1, 0.0)
        hi = np.full(len(b) - 1, 1.0)
        lo[0], hi[-1] = -np.inf, np.inf
        out.append(np.clip(e, lo, hi))
    return np.concatenate(out, axis=1) if out else np.zeros((len(num), 0))


def was_missing(df: pd.DataFrame, cols: list[str]) -> np.ndarray:
    """(n, len(cols)) float64: 1 where the numeric column's value is missing (NaN, blank), else 0."""
    return df[cols].apply(pd.to_numeric, errors="coerce").isna().to_numpy(dtype=np.float64).reshape(len(df), len(cols))


def _ple_expanded(x: np.ndarray, keep: np.ndarray, names: list[str], d: int, edges) -> tuple:
    """The fitted matrix with its d numeric columns replaced by their encodings: (x, keep, names)."""
    bins = [max(len(e) - 1, 0) for e in edges]
    x = np.concatenate([to_ple(x[:, :d], edges), x[:, d:]], axis=1)
    keep = np.concatenate([np.repeat(keep[:d], bins), keep[d:]])
    names = [f"{n}[ple {t}]" for n, b in zip(names[:d], bins) for t in range(b)] + names[d:]
    return x, keep, names


def fit_transform(
    df: pd.DataFrame,
    numeric: list[str],
    categorical: list[str],
    fit_rows: np.ndarray | None,
    where: str,
    recipe: Recipe = Recipe(),
) -> tuple[FeatureTransform, dict]:
    """Fit on ``df`` (statistics on ``fit_rows``; categories from every row, as one-hot always
    was); returns the transform and what fitting dropped and imputed. ``recipe.scale``
    "quantile": numeric columns through their training quantiles to a normal first
    (:func:`to_normal`); "ple": each numeric column as its piecewise-linear encoding over
    ``recipe.ple_bins`` training quantile bins (:func:`to_ple`). ``recipe.missing``
    "indicator": each numeric column with NaN on the fit rows also gets a 0/1 feature saying
    where it was missing (:func:`was_missing`), after the numeric block."""
    blocks, names, imputed, fill, grid, edges, indicate = [], [], {}, (), (), (), ()
    if numeric:
        num, imputed, fill = numeric_features(df, numeric, fit_rows, where)
        grid = quantile_grid(num, fit_rows) if recipe.scale == "quantile" else ()
        edges = ple_edges(num, fit_rows, recipe.ple_bins) if recipe.scale == "ple" else ()
        blocks.append(num)  # raw here: what is constant or empty is judged on the values themselves
        names += numeric
        if recipe.missing == "indicator":
            nan = was_missing(df, numeric)  # (n, d), once: which columns had NaN on the fit rows, and where
            indicate = tuple(int(j) for j in np.flatnonzero((nan if fit_rows is None else nan[fit_rows]).any(axis=0)))
            blocks.append(nan[:, list(indicate)])
            names += [f"{numeric[j]}[missing]" for j in indicate]
    cats = tuple((c, tuple(sorted(df[c].astype(str).unique()))) for c in categorical)
    for col, values in cats:
        blocks.append(one_hot(df[col], values)[0])
        names += [f"{col}_{v}" for v in values]
    x = np.concatenate(blocks, axis=1) if blocks else np.zeros((len(df), 0))
    keep, report = drop_uninformative(x, names, fit_rows, where)
    if grid:
        x[:, : len(numeric)] = to_normal(x[:, : len(numeric)], grid)
    if edges:
        x, keep, names = _ple_expanded(x, keep, names, len(numeric), edges)
    ref = x[:, keep] if fit_rows is None else x[fit_rows][:, keep]
    mean, std = ref.mean(axis=0), ref.std(axis=0)
    std[std == 0] = 1.0
    transform = FeatureTransform(
        tuple(numeric),
        fill,
        cats,
        tuple(int(i) for i in np.flatnonzero(keep)),
        tuple(map(float, mean)),
        tuple(map(float, std)),
        tuple(n for n, k in zip(names, keep) if k),
        grid,
        edges,
        indicate,
    )
    return transform, report | {"nan_imputed": imputed, "nan_imputed_total": sum(imputed.values())}


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
    raise DatasetError(
        f"{where}: feature column {cols[j]!r} {what}{example} in {len(rows)} row(s) "
        f"(first rows: {rows[:5].tolist()}){also}; fix or remove them"
    )


def numeric_features(
    df: pd.DataFrame, cols: list[str], fit_rows: np.ndarray | None, where: str, *, fill: tuple[float, ...] | None = None
) -> tuple[np.ndarray, dict[str, int], tuple[float, ...]]:
    """Numeric feature columns -> (n, len(cols)) float64, NaN replaced by ``fill`` (a fitted
    transform's) or else by the column's mean over ``fit_rows``; non-numbers and inf / -inf are
    refused, never coerced. Also returns the count of imputed NaN per column (columns without
    any left out) and the fill values used."""
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
    return num.fillna(mean).to_numpy(dtype=np.float64), imputed, tuple(map(float, mean))


def drop_uninformative(
    x: np.ndarray, names: list[str], fit_rows: np.ndarray | None, where: str
) -> tuple[np.ndarray, dict]:
    """The columns of x (n, d) to keep: not those without any value on ``fit_rows`` (NaN there:
    nothing to impute from), nor those constant on them; refuse a party left with no column.
    Returns (keep (d,) bool, {"dropped_constant": [...], "dropped_empty": [...]})."""
    ref = x if fit_rows is None else x[fit_rows]
    empty = np.isnan(ref).any(axis=0)  # imputation filled every NaN of a column with any value
    constant = np.zeros(x.shape[1], dtype=bool)
    if len(ref) > 1:
        constant[~empty] = ref[:, ~empty].std(axis=0) == 0
    keep = ~empty & ~constant
    report = {
        "dropped_constant": [n for n, c in zip(names, constant) if c],
        "dropped_empty": [n for n, e in zip(names, empty) if e],
    }
    if not names:
        raise DatasetError(
            f"{where}: no feature column: a party needs at least one feature besides its "
            "identifiers (and the primary's label)"
        )
    if not keep.any():
        rows = "training rows" if fit_rows is not None else "rows"
        raise DatasetError(
            f"{where}: no feature column left: {report['dropped_constant']} are constant and "
            f"{report['dropped_empty']} have no value on the {rows}; the party needs a feature "
            "that varies"
        )
    return keep, report
