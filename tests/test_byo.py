"""Bring-your-own CSV parties: one parties.toml runs every method; bad specs are named."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app.config import ConfigError, RunConfig
from app.data import load_data
from app.modes import run_experiment
from datasets import load_dataset
from datasets.base import DatasetError
from datasets.options import DatasetOptions, Recipe

REPO = Path(__file__).resolve().parents[1]
SPEC = """
task = "regression"
label = "price"
[primary]
file = "sales.csv"
identifiers = ["lat", "lon"]
kind = "numeric"
numeric = ["rooms"]
categorical = ["type"]
[secondaries.shops]
file = "shops.csv"
identifiers = ["y", "x"]
numeric = ["rent"]
"""


def write_parties(folder, spec=SPEC, n=400, seed=0):
    rng = np.random.default_rng(seed)
    shops = pd.DataFrame({"y": rng.uniform(0, 10, 80), "x": rng.uniform(0, 10, 80), "rent": rng.normal(50, 10, 80)})
    near = rng.integers(0, 80, n)  # each sale sits next to a shop whose rent drives its price
    sales = pd.DataFrame(
        {
            "lat": shops["y"].to_numpy()[near] + rng.normal(0, 0.05, n),
            "lon": shops["x"].to_numpy()[near] + rng.normal(0, 0.05, n),
            "rooms": rng.integers(1, 6, n),
            "type": rng.choice(["h", "u"], n),
        }
    )
    sales["price"] = 100 * sales["rooms"] + 5 * shops["rent"].to_numpy()[near] + rng.normal(0, 5, n)
    sales.to_csv(folder / "sales.csv", index=False)
    shops.to_csv(folder / "shops.csv", index=False)
    (folder / "parties.toml").write_text(spec)


@pytest.mark.parametrize("method", ["fedsim", "solo", "top1sim", "avgsim", "featuresim", "exact"])
def test_every_method_runs_on_the_users_csvs(method, tmp_path):
    write_parties(tmp_path)
    cfg = RunConfig.of(
        dataset="csv",
        data_dir=str(tmp_path),
        method=method,
        k=5,
        epochs=2,
        batch_size=32,
        out_dir=str(tmp_path / "runs"),
    )
    s = run_experiment(cfg, tmp_path / "out" / method)
    assert np.isfinite(s["test"]["rmse"]) and s["epochs_run"] == 2


@pytest.mark.parametrize(
    "edit,match",
    [
        (('identifiers = ["y", "x"]', 'identifiers = ["y", "z"]'), r"party 'shops'.*missing column\(s\) \['z'\]"),
        (('label = "price"', 'label = "value"'), "label column 'value' is not in the primary's file sales.csv"),
        (
            ('kind = "numeric"\nnumeric = ["rooms"]', 'kind = "string"\nnumeric = ["rooms"]'),
            "kind 'string' but identifier column 'lat' holds numbers",
        ),
        (
            ('numeric = ["rooms"]\ncategorical = ["type"]', 'numeric = ["rooms", "type"]'),
            r"party 'primary' \(sales.csv\): column 'type' is listed as numeric but holds text, e.g. 'h'; list it under "
            "categorical",
        ),
        (
            ('numeric = ["rooms"]', 'numeric = ["rooms", "price"]'),
            r"party 'primary' \(sales.csv\): the label 'price' is listed as a feature \(numeric\)",
        ),
        (('categorical = ["type"]', 'categorical = ["type", "price"]'), "the label 'price' is listed as a feature"),
        (('task = "regression"', 'task = "ranking"'), "task must be one of"),
        (("[secondaries.shops]", '[secondaries.shops]\ncolour = "red"'), r"unknown key\(s\) \['colour'\]"),
        # a party's name names its files (its model, its linkage): one plain name, as the service's
        (("[secondaries.shops]", '[secondaries."../../../ESCAPED"]'), r"party name '\.\./\.\./\.\./ESCAPED'"),
        (("[secondaries.shops]", '[secondaries."a/../b"]'), r"party name 'a/\.\./b'"),
        (("[secondaries.shops]", "[secondaries.PRIMARY]"), r"distinct, ignoring case.*'PRIMARY'"),
        (("[primary]", '[primary]\nname = "shops"'), r"distinct, ignoring case.*'shops'"),
    ],
)
def test_a_bad_spec_is_named(edit, match, tmp_path):
    write_parties(tmp_path, SPEC.replace(*edit))
    with pytest.raises(DatasetError, match=match):
        load_dataset("csv", tmp_path)


def test_string_identifiers_and_classification_labels(tmp_path):
    titles = ["alpha one", "beta two", "gamma three", "delta four", "epsilon five", "zeta six"] * 10
    pd.DataFrame(
        {"title": [t.upper() for t in titles], "genre": ["a", "b", "c"] * 20, "score": np.arange(60.0)}
    ).to_csv(tmp_path / "p.csv", index=False)
    pd.DataFrame({"name": titles[:6], "hours": np.arange(6.0)}).to_csv(tmp_path / "s.csv", index=False)
    (tmp_path / "parties.toml").write_text("""
task = "multiclass"
label = "genre"
[primary]
file = "p.csv"
identifiers = ["title"]
kind = "string"
numeric = ["score"]
[secondaries.hltb]
file = "s.csv"
identifiers = ["name"]
kind = "string"
numeric = ["hours"]
""")
    ds = load_dataset("csv", tmp_path)
    assert ds.task == "multiclass" and ds.n_classes == 3 and ds.primary.identifiers[0] == "alpha one"
    (tmp_path / "parties.toml").write_text(
        (tmp_path / "parties.toml")
        .read_text()
        .replace('identifiers = ["name"]\nkind = "string"', 'identifiers = ["hours"]\nkind = "string"')
    )
    with pytest.raises(DatasetError, match="kind 'string' but identifier column 'hours' holds numbers"):
        load_dataset("csv", tmp_path)


def test_game_and_house_load_without_label_leaks():
    game = load_dataset("game")
    assert game.task == "binary" and "hltb" in game.secondaries and game.primary.id_kind == "string"
    assert not any("rating" in n or "playtime" in n for n in game.primary.feature_names)
    house = load_dataset("house")
    assert not any(n.startswith(("Suburb", "Postcode", "CouncilArea", "Distance")) for n in house.primary.feature_names)


def test_a_secondary_reads_only_its_own_csv(tmp_path):
    """A deployed SuperNode of a csv dataset needs neither the primary's nor other parties' files."""
    from app.vfl.parties import secondary_features

    full, alone = tmp_path / "full", tmp_path / "alone"
    full.mkdir()
    alone.mkdir()
    write_parties(full)
    (alone / "parties.toml").write_text(SPEC)
    (alone / "shops.csv").write_bytes((full / "shops.csv").read_bytes())  # no sales.csv here
    want = load_dataset("csv", full).secondaries["shops"].features
    got = secondary_features(RunConfig.of(dataset="csv", data_dir=str(alone)), "shops")
    np.testing.assert_array_equal(got, want)
    with pytest.raises(DatasetError, match="party 'bank' is not a secondary"):
        secondary_features(RunConfig.of(dataset="csv", data_dir=str(alone)), "bank")


def test_a_relative_data_dir_is_shown_absolute_in_every_path_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError, match=f"none at {tmp_path / 'mine' / 'parties.toml'}"):
        load_dataset("csv", "mine")
    (tmp_path / "mine").mkdir()
    write_parties(tmp_path / "mine")
    (tmp_path / "mine" / "shops.csv").unlink()
    with pytest.raises(DatasetError, match=f"file {tmp_path / 'mine' / 'shops.csv'} not found"):
        load_dataset("csv", "mine")
    (tmp_path / "mine" / "parties.toml").write_text("task = ")
    with pytest.raises(DatasetError, match=f"{tmp_path / 'mine' / 'parties.toml'}: not valid TOML"):
        load_dataset("csv", "mine")
    with pytest.raises(DatasetError, match=f"data folder 'frog' not found in data-dir '{tmp_path / 'mine'}'"):
        load_dataset("frog", "mine")


def test_each_csv_party_declares_its_own_input_recipe(tmp_path):
    """Issue 34: a party's section says ``scale = "quantile"`` for its own numeric columns (the
    others keep theirs); an unknown recipe is refused by name. Run-config input-scale (the recipe
    search's candidates) sets the scale of a party that declares none, never a declared one."""
    write_parties(tmp_path, SPEC.replace('numeric = ["rent"]', 'numeric = ["rent"]\nscale = "quantile"'))
    ds = load_dataset("csv", tmp_path)
    assert ds.secondaries["shops"].transform.quantiles and not ds.primary.transform.quantiles
    write_parties(tmp_path, SPEC.replace('numeric = ["rent"]', 'numeric = ["rent"]\nscale = "log"'))
    with pytest.raises(DatasetError, match="scale must be one of"):
        load_dataset("csv", tmp_path)
    write_parties(tmp_path, SPEC.replace('numeric = ["rent"]', 'numeric = ["rent"]\nscale = "quantile"'))
    ple = load_dataset("csv", tmp_path, DatasetOptions(recipe=Recipe("ple")))
    assert ple.secondaries["shops"].transform.quantiles and not ple.secondaries["shops"].transform.ple
    assert ple.primary.transform.ple  # declared nothing: the run's scale
    with pytest.raises(ConfigError, match="input-scale"):
        RunConfig.from_flower({"dataset": "csv", "input-scale": "log"})


def test_each_csv_party_declares_how_its_missing_values_are_filled(tmp_path):
    """Issue 34: ``missing = "indicator"`` in a party's section adds a 0/1 feature beside each of
    its numeric columns with NaN (the other parties keep the mean only); an unknown value is
    refused by name, and so is the run-config key for csv (each party decides its own)."""
    write_parties(tmp_path, SPEC.replace('numeric = ["rent"]', 'numeric = ["rent"]\nmissing = "indicator"'))
    shops = pd.read_csv(tmp_path / "shops.csv")
    shops.loc[[1, 4], "rent"] = np.nan
    shops.to_csv(tmp_path / "shops.csv", index=False)
    ds = load_dataset("csv", tmp_path)
    assert "rent[missing]" in ds.secondaries["shops"].feature_names
    assert not any("[missing]" in n for n in ds.primary.feature_names)
    write_parties(tmp_path, SPEC.replace('numeric = ["rent"]', 'numeric = ["rent"]\nmissing = "zero"'))
    with pytest.raises(DatasetError, match="missing must be one of"):
        load_dataset("csv", tmp_path)
    with pytest.raises(ConfigError, match="run-config 'missing' is for the shipped datasets"):
        RunConfig.from_flower({"dataset": "csv", "missing": "indicator"})
    with pytest.raises(ConfigError, match="run-config 'missing' must be one of"):
        RunConfig.from_flower({"dataset": "house", "missing": "zero"})


def test_a_deployed_partys_feature_cache_never_serves_stale_features(tmp_path):
    """A deployed secondary keeps its parsed feature matrix in its node's cache-dir. The cache
    belongs to exactly what it was built from: a changed CSV, a recipe changed in the party's own
    parties.toml section, or a run-config key of the recipe (``missing``) all rebuild it; the
    same inputs reuse it (the saved file is read, not the CSV)."""
    from app.vfl.parties import secondary_features

    data, cache = tmp_path / "data", tmp_path / "cache"
    data.mkdir()
    cache.mkdir()
    write_parties(data)
    cfg = RunConfig.of(dataset="csv", data_dir=str(data))
    first = np.array(secondary_features(cfg, "shops", str(cache)))
    np.testing.assert_array_equal(secondary_features(cfg, "shops", str(cache)), first)
    assert len(list(cache.glob("features-shops-*.npy"))) == 1  # reused, not rebuilt
    hit = (  # a deployed SuperNode runs each message in a fresh process: a cache hit imports no pandas
        "import sys; from app.config import RunConfig; from app.vfl.parties import secondary_features; "
        f"secondary_features(RunConfig.of(dataset='csv', data_dir={str(data)!r}), 'shops', {str(cache)!r}); "
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", hit], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr

    shops = pd.read_csv(data / "shops.csv")
    shops["rent"] = shops["rent"] * 2 + 7  # the party corrected its data: a new standardisation
    shops.loc[0, "rent"] = 1e4
    shops.to_csv(data / "shops.csv", index=False)
    edited = np.array(secondary_features(cfg, "shops", str(cache)))
    np.testing.assert_array_equal(edited, load_dataset("csv", data).secondaries["shops"].features)
    assert not np.array_equal(edited, first)

    (data / "parties.toml").write_text(SPEC.replace('numeric = ["rent"]', 'numeric = ["rent"]\nscale = "ple"'))
    assert np.array(secondary_features(cfg, "shops", str(cache))).shape[1] > 1  # ple: a feature per bin

    plain = np.array(secondary_features(RunConfig.of(dataset="house3", n_rows=300), "airbnb_b", str(cache)))
    flagged_cfg = RunConfig.of(dataset="house3", n_rows=300, missing="indicator")
    flagged = np.array(secondary_features(flagged_cfg, "airbnb_b", str(cache)))
    np.testing.assert_array_equal(flagged, load_data(flagged_cfg).secondaries["airbnb_b"].features)
    assert flagged.shape[1] == plain.shape[1] + 2  # reviews_per_month[missing], rating[missing]


def test_the_encodings_bin_count_is_each_partys_own_and_refused_where_it_means_nothing(tmp_path):
    """Issue 34's bin-count ablation: ``ple_bins`` in a csv party's section (with its scale
    "ple"), ``ple-bins`` in the run config for the shipped datasets; either refused by name out
    of range or where no piecewise-linear encoding uses it; the run records its value."""
    ple4 = 'numeric = ["rent"]\nscale = "ple"\nple_bins = 4'
    write_parties(tmp_path, SPEC.replace('numeric = ["rent"]', ple4))
    names = load_dataset("csv", tmp_path).secondaries["shops"].feature_names
    assert sum(n.startswith("rent[ple ") for n in names) == 4
    for bad, match in [
        ('numeric = ["rent"]\nple_bins = 4', "sets ple_bins, which only scale"),
        ('numeric = ["rent"]\nscale = "ple"\nple_bins = 1', r"ple_bins must be a whole number in \[2, 256\]"),
        ('numeric = ["rent"]\nscale = "ple"\nple_bins = "8"', "ple_bins must be a whole number"),
    ]:
        write_parties(tmp_path, SPEC.replace('numeric = ["rent"]', bad))
        with pytest.raises(DatasetError, match=match):
            load_dataset("csv", tmp_path)
    for flat, match in [
        ({"dataset": "csv", "ple-bins": 8}, "each party declares its own"),
        ({"dataset": "house", "input-scale": "ple", "ple-bins": 1}, r"must be in \[2, 256\]"),
        ({"dataset": "house", "ple-bins": 8}, "'ple-bins' is for input-scale"),  # the default: standard
        ({"dataset": "house", "input-scale": "standard", "ple-bins": 8}, "'ple-bins' is for input-scale"),
    ]:
        with pytest.raises(ConfigError, match=match):
            RunConfig.from_flower(flat)
    for flat in ({"input-scale": "ple"}, {"hparams": "dataset"}):  # ple given, or house's hand-chosen recipe
        rows = RunConfig.from_flower({"dataset": "house", "ple-bins": 8, **flat}).hyperparameters()
        assert rows["ple_bins"] == {"value": 8, "source": "run config"}
    assert "ple_bins" not in RunConfig.from_flower({"dataset": "house"}).hyperparameters()  # standard: none


@pytest.mark.parametrize("names", [("values",), ("keys", "items")], ids=["one", "two"])
def test_a_party_named_like_a_torch_containers_method_trains_fedsim_attn_and_predicts_its_evaluation(names, tmp_path):
    """A secondary called "values" (a natural name for a party holding house values) crashed
    fedsim_attn: its parameters were kept in torch dicts keyed by the party's name, and a dict's
    own method of that name refused the key. With two such parties each has its own path."""
    write_parties(tmp_path)
    spec = SPEC.replace("[secondaries.shops]", f"[secondaries.{names[0]}]")
    for name in names[1:]:
        spec += f'[secondaries.{name}]\nfile = "shops.csv"\nidentifiers = ["y", "x"]\nnumeric = ["rent"]\n'
    (tmp_path / "parties.toml").write_text(spec)
    cfg = RunConfig.of(dataset="csv", data_dir=str(tmp_path), k=4, epochs=2, batch_size=32, out_dir=str(tmp_path / "o"))
    summary = run_experiment(cfg, tmp_path / "run")
    ds = load_data(cfg)
    from app.vfl.predict import predict_in_process

    test = ds.split.test
    pred = predict_in_process(tmp_path / "run", ds.primary.features[test], ds.primary.identifiers[test])
    rmse = float(np.sqrt(np.mean((pred.values - ds.labels[test]) ** 2)))
    assert rmse == pytest.approx(summary["test"]["rmse"], rel=1e-4)


def test_a_column_named_twice_in_a_partys_csv_is_refused_naming_it(tmp_path):
    """pandas read the second 'rooms' as 'rooms.1', which no spec names: one copy was silently unused."""
    write_parties(tmp_path)
    sales = (tmp_path / "sales.csv").read_text().splitlines()
    first = sales[0].split(",")
    sales = [f"{line},{line.split(',')[first.index('rooms')]}" for line in sales]  # header "...,rooms"
    (tmp_path / "sales.csv").write_text("\n".join(sales) + "\n")
    with pytest.raises(DatasetError, match=r"sales\.csv names column\(s\) \['rooms'\] more than once"):
        load_dataset("csv", tmp_path)


def test_encode_and_link_refuse_a_csv_naming_a_column_twice(tmp_path):
    from linkage.contracts import LinkageError
    from linkage_server.csv_ids import read_csv_identifiers

    (tmp_path / "ids.csv").write_text("lat,lon,lat\n1.0,2.0,3.0\n")
    with pytest.raises(LinkageError, match=r"names column\(s\) \['lat'\] more than once"):
        read_csv_identifiers(str(tmp_path / "ids.csv"), ["lat", "lon"], "numeric")


def test_a_csv_that_is_not_utf8_is_refused_naming_the_file(tmp_path):
    write_parties(tmp_path)
    raw = (tmp_path / "shops.csv").read_bytes().replace(b"rent", b"r\xe9nt", 1)  # Latin-1, as a spreadsheet may save
    (tmp_path / "shops.csv").write_bytes(raw)
    with pytest.raises(DatasetError, match=r"shops\.csv is not UTF-8 text"):
        load_dataset("csv", tmp_path)


def test_a_parties_toml_saved_with_a_byte_order_mark_is_read(tmp_path):
    write_parties(tmp_path)
    (tmp_path / "parties.toml").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "parties.toml").read_bytes())
    assert load_dataset("csv", tmp_path).party_names == ["shops"]


@pytest.mark.parametrize(
    "ids, match",
    [
        ('["lat", "lat"]', r"names identifier column\(s\) \['lat'\] more than once"),
        ('"lat"', "identifiers must be a list of column names"),
        ("[]", "identifiers must be a list of column names"),
        ('["lat", 3]', "identifiers must be a list of column names"),
    ],
)
def test_a_partys_identifiers_are_a_list_of_distinct_columns(tmp_path, ids, match):
    """["lat", "lat"] linked the primary's latitude against a secondary's longitude, exit 0; "lat"
    was read as the columns 'l', 'a', 't'."""
    write_parties(tmp_path, SPEC.replace('identifiers = ["lat", "lon"]', f"identifiers = {ids}"))
    with pytest.raises(DatasetError, match=match):
        load_dataset("csv", tmp_path)


def test_n_rows_over_the_primarys_rows_is_refused_naming_both(tmp_path):
    """`-c n-rows=5000` on a 400-row file trained on the 400 without a word."""
    write_parties(tmp_path)
    assert load_dataset("csv", tmp_path, DatasetOptions(n_rows=400)).primary.n_rows == 400  # all of them: fine
    with pytest.raises(DatasetError, match=r"n-rows = 5000 is more than the primary's 400 rows \(sales.csv\)"):
        load_dataset("csv", tmp_path, DatasetOptions(n_rows=5000))
