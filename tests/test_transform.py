"""A party's fitted feature transform (datasets/transform.py): the features training used are
exactly what the transform gives for the same rows, so new records are prepared alike; bad or
unseen values in new records are named, never silently coerced."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from datasets import load_dataset
from datasets.base import DatasetError
from datasets.options import PLE_BINS, Recipe
from datasets.tables import Columns, party_table
from datasets.transform import FeatureTransform, ple_edges, to_ple
from tests.test_byo import write_parties


def planted(n: int = 60, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "lat": rng.uniform(0, 1, n),
            "lon": rng.uniform(0, 1, n),
            "size": rng.normal(70, 20, n),
            "age": rng.integers(0, 50, n).astype(float),
            "flat": 3.0,
            "kind": rng.choice(["a", "b", "c"], n),
            "town": rng.choice(["x", "y"], n),
        }
    )
    df.loc[[3, 17, 40], "size"] = np.nan  # imputed with the training mean
    return df


def table(df: pd.DataFrame, fit_rows=None, scale: str = "standard", missing: str = "mean"):
    return party_table(
        "p",
        df,
        Columns(["lat", "lon"], "numeric", numeric=["size", "age", "flat"], categorical=["kind", "town"]),
        fit_rows=fit_rows,
        recipe=Recipe(scale, missing),
    )


@pytest.mark.parametrize("missing", ["mean", "indicator"])
@pytest.mark.parametrize("scale", ["standard", "quantile", "ple"])
def test_the_transform_gives_the_training_features_bitwise(scale, missing):
    df, fit_rows = planted(), np.arange(0, 60, 2)
    t = table(df, fit_rows, scale, missing)
    again, report = t.transform.apply(df, "p")
    assert again.dtype == np.float32 and np.array_equal(again, t.features)
    assert t.transform.names == t.feature_names and "flat" not in t.feature_names  # constant: dropped
    assert report["nan_imputed"] == {"size": 3} and report["unseen_categories"] == {}
    restored = FeatureTransform.from_json(t.transform.to_json())
    assert restored == t.transform and np.array_equal(restored.apply(df, "p")[0], t.features)


def test_new_records_one_at_a_time_equal_the_batch():
    df = planted()
    t = table(df, np.arange(40))
    batch, _ = t.transform.apply(df.iloc[40:], "new")
    single = np.vstack([t.transform.apply(df.iloc[[i]], "new")[0] for i in range(40, 60)])
    assert np.array_equal(batch, single) and np.array_equal(batch, t.features[40:])


def test_a_csv_partys_transform_reprepares_its_file(tmp_path):
    """The loader's own frame: the user's CSV read again gives the loaded features."""
    write_parties(tmp_path)
    ds = load_dataset("csv", tmp_path)
    raw = pd.read_csv(tmp_path / "sales.csv")
    assert np.array_equal(ds.primary.transform.apply(raw, "sales.csv")[0], ds.primary.features)
    shops = pd.read_csv(tmp_path / "shops.csv")
    assert np.array_equal(
        ds.secondaries["shops"].transform.apply(shops, "shops.csv")[0], ds.secondaries["shops"].features
    )


def test_an_unseen_category_sets_no_one_hot_and_is_counted_or_refused():
    df = planted()
    t = table(df).transform
    new = df.iloc[:4].copy()
    new.loc[new.index[1], "kind"] = "zzz"
    x, report = t.apply(new, "new")
    cols = [i for i, n in enumerate(t.names) if n.startswith("kind_")]
    raw_onehot = x[1, cols] * np.asarray(t.std)[cols] + np.asarray(t.mean)[cols]  # undo the scaling
    assert np.allclose(raw_onehot, 0.0, atol=1e-6) and report["unseen_categories"] == {"kind": 1}
    assert np.array_equal(x[[0, 2, 3]], t.apply(df.iloc[[0, 2, 3]], "new")[0])
    with pytest.raises(DatasetError, match=r"column 'kind' holds 1 value\(s\) not seen in training, e.g. 'zzz'"):
        t.apply(new, "new", unknown="refuse")


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d.drop(columns=["age"]), r"new: missing column\(s\) \['age'\]"),
        (lambda d: d.drop(columns=["town"]), r"new: missing column\(s\) \['town'\]"),
        (
            lambda d: d.assign(size=["big"] + [1.0] * (len(d) - 1)),
            "feature column 'size' holds non-numbers, e.g. 'big'",
        ),
        (lambda d: d.assign(age=[np.inf] + [1.0] * (len(d) - 1)), "feature column 'age' holds non-finite values"),
    ],
)
def test_bad_new_records_are_refused_by_name(edit, match):
    t = table(planted()).transform
    with pytest.raises(DatasetError, match=match):
        t.apply(edit(planted().iloc[:5].reset_index(drop=True)), "new")


def test_whole_numbers_read_as_floats_match_their_training_category_and_nan_fills_are_strict_json():
    df = planted().assign(zone=np.arange(60) % 3 + 1)  # int categories 1, 2, 3 in training
    df.loc[5, "size"] = np.nan
    t = party_table(
        "p",
        df.assign(empty=np.nan),
        Columns(["lat", "lon"], "numeric", numeric=["size", "empty"], categorical=["zone"]),
    ).transform
    new = df.iloc[:4].assign(empty=np.nan, zone=[2.0, np.nan, 3.0, 1.0])  # a blank cell: pandas reads floats
    x, report = t.apply(new, "new")
    assert report["unseen_categories"] == {"zone": 1}  # only the blank
    assert np.array_equal(x[[0, 2, 3]], t.apply(df.iloc[[0, 2, 3]].assign(empty=np.nan, zone=[2, 3, 1]), "new")[0])
    text = t.to_json()
    assert "NaN" not in text and FeatureTransform.from_json(text).to_json() == text


def test_the_quantile_recipe_makes_a_long_tail_normal_on_the_training_rows_and_predicts_alike():
    """Issue 34's input recipe: a log-normal column (house prices' shape) comes out about a
    standard normal on the fit rows (skew ~0 instead of ~6), monotone in the raw value; the kept
    transform maps new values through the same quantiles (out of range: clipped to the ends)."""
    rng = np.random.default_rng(0)
    df = planted(400)
    df["size"] = rng.lognormal(4, 1.2, 400)
    fit_rows = np.arange(300)
    std, qt = table(df, fit_rows).features[:, 0], table(df, fit_rows, "quantile").features[:, 0]
    skew = lambda x: float(((x - x.mean()) ** 3).mean() / x.std() ** 3)  # noqa: E731
    assert skew(std[fit_rows]) > 3 and abs(skew(qt[fit_rows])) < 0.3
    order = np.argsort(df["size"].to_numpy()[fit_rows])
    assert (np.diff(qt[fit_rows][order]) >= 0).all()
    t = table(df, fit_rows, "quantile").transform
    new = df.iloc[:3].copy()
    new["size"] = [1e9, -5.0, float(df["size"].iloc[0])]
    got = t.apply(new, "new")[0][:, 0]
    assert got[0] >= qt[fit_rows].max() - 1e-6 and got[1] <= qt[fit_rows].min() + 1e-6 and got[2] == qt[0]


def test_the_piecewise_linear_encoding_fills_its_bins_in_order_and_extrapolates_at_the_ends():
    """Issue 34's "ple" recipe (Gorishniy et al. 2022): a value fills the bins below it, part of
    its own and none above; the first bin extends below the training range and the last above, so
    the encoding is exact: b_0 + sum_t e_t (b_t - b_t-1) gives the value back."""
    edges = ((0.0, 1.0, 2.0, 4.0),)
    x = np.array([[3.0], [-1.0], [6.0], [0.5], [2.0]])
    enc = to_ple(x, edges)
    assert enc.tolist() == [[1, 1, 0.5], [-1, 0, 0], [1, 1, 2], [0.5, 0, 0], [1, 1, 0]]
    assert np.allclose(0.0 + enc @ np.diff(edges[0]), x[:, 0])
    rng = np.random.default_rng(0)
    num = np.column_stack([rng.lognormal(4, 1.2, 500), rng.integers(0, 3, 500), np.full(500, 7.0)])
    fitted = ple_edges(num, np.arange(400))
    assert [len(e) - 1 for e in fitted] == [PLE_BINS, 2, 0]  # a constant column has no bin
    assert np.allclose(fitted[0][0] + to_ple(num, fitted)[:, :PLE_BINS] @ np.diff(fitted[0]), num[:, 0])
    t = table(planted(400), np.arange(300), "ple")
    assert sum(n.startswith("size[ple ") for n in t.feature_names) == PLE_BINS


@pytest.mark.parametrize("bins", [2, 5, 40])
def test_the_encodings_bin_count_is_part_of_the_kept_transform(bins):
    """Issue 34's bin-count ablation: ``Recipe.ple_bins`` cuts each column at that many training
    quantiles (fewer where quantiles tie), and the kept transform, through JSON, encodes new
    records with the same edges (apply == training features, bitwise)."""
    df, fit_rows = planted(400), np.arange(300)
    t = party_table(
        "p",
        df,
        Columns(["lat", "lon"], "numeric", numeric=["size", "age"]),
        fit_rows=fit_rows,
        recipe=Recipe("ple", "mean", bins),
    )
    size_bins = sum(n.startswith("size[ple ") for n in t.feature_names)
    assert size_bins == bins  # size is continuous: no ties
    ages = df["age"].to_numpy()[fit_rows]  # whole numbers: tied quantiles merge into one edge
    want = len(np.unique(np.quantile(ages, np.linspace(0, 1, bins + 1)))) - 1
    assert sum(n.startswith("age[ple ") for n in t.feature_names) == want <= bins
    restored = FeatureTransform.from_json(t.transform.to_json())
    assert np.array_equal(restored.apply(df, "p")[0], t.features)
    assert Recipe("ple", "mean", 1).problems() and Recipe("ple", "mean", 2.5).problems()  # refused by name


@pytest.mark.parametrize("scale", ["standard", "ple"])
def test_the_missing_indicator_marks_exactly_the_missing_cells(scale):
    """Issue 34's missing = "indicator": a column with NaN on the fit rows gets one 0/1 feature,
    1 exactly where it was missing (standardised like every feature: two values, the higher for
    missing), the imputed value beside it unchanged; columns without NaN get none; a new record
    with a NaN in that column is marked alike; "mean" adds nothing."""
    df, fit_rows = planted(), np.arange(0, 60, 2)  # NaN at rows 3, 17, 40: 40 is a fit row
    plain, marked = table(df, fit_rows, scale), table(df, fit_rows, scale, "indicator")
    assert [n for n in marked.feature_names if "[missing]" in n] == ["size[missing]"]
    assert not any("[missing]" in n for n in plain.feature_names)
    col = marked.feature_names.index("size[missing]")
    flag = marked.features[:, col]
    assert len(np.unique(flag)) == 2 and np.array_equal(np.flatnonzero(flag == flag.max()), [3, 17, 40])
    others = [j for j, n in enumerate(marked.feature_names) if j != col]
    assert np.array_equal(marked.features[:, others], plain.features)  # the rest as without the indicator
    new = df.iloc[[5, 6]].copy()
    new.loc[new.index[1], "size"] = np.nan
    got, report = marked.transform.apply(new, "new")
    assert got[0, col] == flag.min() and got[1, col] == flag.max() and report["nan_imputed"] == {"size": 1}
    no_nan_on_fit = table(df, np.arange(20, 40, 2), scale, "indicator")  # rows 20..38: no NaN
    assert not any("[missing]" in n for n in no_nan_on_fit.feature_names)
