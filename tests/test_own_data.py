"""People with their own data: Entity Augmentation on CSVs whose parties declare an entity id
column, feature lists as patterns or "rest", several string identifier columns, a linkage
metric in parties.toml, and the shipped example folders (docs/own-data.md)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app.config import RunConfig
from app.modes import run_experiment
from datasets import DatasetError, load_dataset
from datasets.options import DatasetOptions
from datasets.overlap import PRIMARY_BLOCK, entity_data, entity_overlap
from linkage.contracts import DEFAULT_STRING_METRIC

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

EA_SPEC = """
task = "multiclass"
label = "y"
[primary]
file = "labels.csv"
entity_id = "id"
[secondaries.a]
file = "a.csv"
entity_id = "id"
numeric = ["a_*"]
[secondaries.b]
file = "b.csv"
entity_id = "id"
numeric = "rest"
"""


def write_entities(folder: Path, spec: str = EA_SPEC, n: int = 300, seed: int = 0) -> dict:
    """A label holder (id, y) and two guests, each holding its own subset of the entities (in
    its own row order, a few ids the label holder does not know); features carry the class."""
    rng = np.random.default_rng(seed)
    ids = np.array([f"e{i:04d}" for i in range(n)])
    y = rng.integers(0, 3, n)
    held = {"a": rng.random(n) < 0.7, "b": rng.random(n) < 0.7}
    held["a"][:20] = held["b"][:20] = False  # 20 entities nobody holds besides the label holder
    pd.DataFrame({"id": ids, "y": y}).to_csv(folder / "labels.csv", index=False)
    for p, width in (("a", 4), ("b", 3)):
        rows = rng.permutation(np.flatnonzero(held[p]))
        x = y[rows, None] + rng.normal(0, 0.3, (len(rows), width))
        df = pd.DataFrame(x, columns=[f"{p}_{j}" for j in range(width)])
        df.insert(0, "id", ids[rows])
        extra = pd.DataFrame(rng.normal(size=(5, width)), columns=df.columns[1:])
        extra.insert(0, "id", [f"x{p}{i}" for i in range(5)])  # unknown to the label holder
        pd.concat([df, extra]).to_csv(folder / f"{p}.csv", index=False)
    (folder / "parties.toml").write_text(spec)
    return {"ids": ids, "y": y, "held": held}


# ---------------------------------------------------------------------------- entity ids


def test_entity_ids_give_each_party_the_entities_it_holds(tmp_path):
    truth = write_entities(tmp_path)
    ds = load_dataset("csv", tmp_path)
    assert ds.primary.n_features == 0  # the label holder may hold labels only
    assert ds.secondaries["a"].feature_names == ("a_0", "a_1", "a_2", "a_3")  # pattern, id column left out
    assert ds.secondaries["b"].feature_names == ("b_0", "b_1", "b_2")  # "rest"
    data = entity_data(ds)
    some = truth["held"]["a"] | truth["held"]["b"]
    assert data.parties == ["a", "b"] and len(data.labels) == some.sum()  # held by nobody: dropped
    np.testing.assert_array_equal(data.entity_ids, truth["ids"][some])
    np.testing.assert_array_equal(data.labels, truth["y"][some])
    for p in ("a", "b"):
        np.testing.assert_array_equal(data.held[p], truth["held"][p][some])
        raw = pd.read_csv(tmp_path / f"{p}.csv").set_index("id")
        j = int(np.flatnonzero(data.held[p])[0])  # a block row is that party's record of the entity
        want = raw.loc[data.entity_ids[j]].to_numpy()
        got = data.blocks[p][j] * raw.to_numpy().std(0) + raw.to_numpy().mean(0)  # standardised on all rows
        np.testing.assert_allclose(got, want, rtol=1e-4)
    both = data.held["a"] & data.held["b"]
    split = data.split
    assert both[split.val].all() and both[split.test].all()  # evaluated entities: held by every party
    assert sorted(np.concatenate([split.train, split.val, split.test]).tolist()) == list(range(len(data.labels)))
    aligned, shares = entity_overlap(data, 0.05, np.random.default_rng(0))  # ids decide, not the fraction
    np.testing.assert_array_equal(aligned, split.train[both[split.train]])
    np.testing.assert_array_equal(shares[0], split.train[(data.held["a"] & ~both)[split.train]])
    np.testing.assert_array_equal(np.sort(np.concatenate([aligned, *shares])), split.train)


def test_entity_aug_trains_in_process_on_the_users_csvs(tmp_path):
    write_entities(tmp_path)
    cfg = RunConfig.of(
        dataset="csv",
        data_dir=str(tmp_path),
        mode="entity-aug",
        epochs=4,
        batch_size=32,
        out_dir=str(tmp_path / "runs"),
    )
    summary = run_experiment(cfg, tmp_path / "run")
    data = entity_data(load_dataset("csv", tmp_path))
    train = data.split.train
    both = (data.held["a"] & data.held["b"])[train]
    assert summary["entities"]["aligned"] == both.sum() and summary["entities"]["train"] == len(train)
    assert summary["entities"]["records_per_party"] == {p: int(data.held[p][train].sum()) for p in ("a", "b")}
    assert summary["test"]["accuracy"] > 0.6  # 3 classes: chance is 1/3


def test_the_primary_block_holds_every_labelled_entity(tmp_path):
    write_entities(
        tmp_path,
        EA_SPEC.replace('entity_id = "id"\n[secondaries.a]', 'entity_id = "id"\nnumeric = ["h"]\n[secondaries.a]'),
    )
    df = pd.read_csv(tmp_path / "labels.csv")
    df.assign(h=df["y"] + np.random.default_rng(1).normal(0, 1, len(df))).to_csv(tmp_path / "labels.csv", index=False)
    data = entity_data(load_dataset("csv", tmp_path))
    assert data.parties == ["a", "b", PRIMARY_BLOCK] and len(data.labels) == 300 and data.held[PRIMARY_BLOCK].all()


def test_full_variant_and_csv_without_entity_ids_are_refused(tmp_path):
    write_entities(tmp_path)
    data = entity_data(load_dataset("csv", tmp_path))
    with pytest.raises(DatasetError, match=r"ea-variant 'full' .* entity ids leave some out"):
        entity_overlap(data, 1.0, np.random.default_rng(0), "full")
    (tmp_path / "parties.toml").write_text(EA_SPEC.replace('entity_id = "id"', 'identifiers = ["id"]\nkind = "string"'))
    with pytest.raises(DatasetError, match=r"declare each party's entity id column in parties.toml \(entity_id ="):
        entity_data(load_dataset("csv", tmp_path))


@pytest.mark.parametrize(
    "edit,match",
    [
        (
            (
                '[secondaries.b]\nfile = "b.csv"\nentity_id = "id"',
                '[secondaries.b]\nfile = "b.csv"\nidentifiers = ["id"]',
            ),
            r"entity_id is declared for \['a', 'primary'\] but not for \['b'\]",
        ),
        (
            ('file = "b.csv"\nentity_id = "id"', 'file = "b.csv"\nentity_id = "key"'),
            r"party 'b'.*missing column\(s\) \['key'\]",
        ),
        (('numeric = ["a_*"]', 'numeric = ["a_*", "id"]'), "the entity id 'id' is listed as a feature"),
        (('numeric = ["a_*"]', 'numeric = ["z_*"]'), r"numeric pattern 'z_\*' matches no column"),
        (('numeric = ["a_*"]', 'numeric = "rest"\ncategorical = "rest"'), "'rest' in both numeric and categorical"),
        (
            ('numeric = ["a_*"]', 'numeric = ["a_0", "a_1"]\ncategorical = ["a_1"]'),
            r"\['a_1'\] listed as both numeric and",
        ),
    ],
)
def test_bad_entity_specs_are_named(edit, match, tmp_path):
    write_entities(tmp_path, EA_SPEC.replace(*edit))
    with pytest.raises(DatasetError, match=match):
        load_dataset("csv", tmp_path)


def test_patterns_and_rest_pick_the_free_columns_in_file_order():
    from datasets.columns import feature_columns

    cols = ["id", "lat", "px_1", "kind", "px_0", "y", "note"]
    reserved = {"id": "entity id", "lat": "identifier", "y": "label"}
    assert feature_columns(cols, ["px_*"], None, reserved, "p") == (["px_1", "px_0"], [])
    assert feature_columns(cols, "rest", ["kind"], reserved, "p") == (["px_1", "px_0", "note"], ["kind"])
    assert feature_columns(cols, ["px_?", "lat"], "rest", reserved, "p") == (["px_1", "px_0", "lat"], ["kind", "note"])
    assert feature_columns(cols, "*", ["px_0"], reserved, "p") == (["px_1", "kind", "note"], ["px_0"])  # named wins
    with pytest.raises(DatasetError, match="p: the label 'y' is listed as a feature \\(categorical\\)"):
        feature_columns(cols, "rest", ["y"], reserved, "p")


def test_duplicate_ids_and_too_few_shared_entities_are_refused(tmp_path):
    write_entities(tmp_path)
    a = pd.read_csv(tmp_path / "a.csv")
    pd.concat([a, a.iloc[:1]]).to_csv(tmp_path / "a.csv", index=False)
    with pytest.raises(DatasetError, match=r"party 'a' \(a.csv\): entity id 'e\d+' appears 2 times"):
        load_dataset("csv", tmp_path)
    write_entities(tmp_path)
    b = pd.read_csv(tmp_path / "b.csv")
    b[~b["id"].isin(a["id"])].to_csv(tmp_path / "b.csv", index=False)  # no entity in both guests
    with pytest.raises(DatasetError, match="only 0 of the label holder's entities are held by every party"):
        load_dataset("csv", tmp_path)


# ---------------------------------------------------------------------------- strings and metric


STRING_SPEC = """
task = "binary"
label = "y"
{metric}
[primary]
file = "p.csv"
identifiers = ["name", "city"]
kind = "string"
numeric = ["f"]
[secondaries.s]
file = "s.csv"
identifiers = ["title", "town"]
kind = "string"
numeric = ["g"]
"""


def write_strings(folder: Path, metric: str = "") -> None:
    names = ["Acme  Ltd", "Bolt Inc", "Cog Co", "Dyno Ltd"] * 10
    pd.DataFrame({"name": names, "city": ["Perth", "Oslo"] * 20, "f": np.arange(40.0), "y": [0, 1] * 20}).to_csv(
        folder / "p.csv", index=False
    )
    pd.DataFrame({"title": names[:8], "town": ["perth", "OSLO"] * 4, "g": np.arange(8.0)}).to_csv(
        folder / "s.csv", index=False
    )
    (folder / "parties.toml").write_text(STRING_SPEC.format(metric=metric))


def test_several_string_identifier_columns_load_as_n_by_c(tmp_path):
    write_strings(tmp_path)
    ds = load_dataset("csv", tmp_path)
    assert ds.primary.identifiers.shape == (40, 2) and ds.secondaries["s"].identifiers.shape == (8, 2)
    assert ds.primary.identifiers[0].tolist() == ["acme ltd", "perth"]  # normalised per column
    assert ds.secondaries["s"].identifiers[1].tolist() == ["bolt inc", "oslo"]
    (tmp_path / "parties.toml").write_text(STRING_SPEC.format(metric="").replace('["title", "town"]', '["title"]'))
    with pytest.raises(DatasetError, match=r"party 's' has identifiers of shape \(\)"):
        load_dataset("csv", tmp_path)
    write_strings(tmp_path)
    p = pd.read_csv(tmp_path / "p.csv")
    p.loc[3, "city"] = None
    p.to_csv(tmp_path / "p.csv", index=False)
    with pytest.raises(DatasetError, match=r"p.csv, line 5, column 'city': an empty cell is no identifier"):
        load_dataset("csv", tmp_path)


def test_string_identifiers_are_read_as_text_in_training_as_in_linkage(tmp_path):
    """Issue 29: with kind "string" a zip code "02134" stays "02134" (not 2134, which training
    refused as "holds numbers") and a surname "NA" is a name, as `fedsim link --kind strings`
    reads them (linkage_server/csv_ids.py); only a blank cell is a missing identifier."""
    write_strings(tmp_path)
    p = pd.read_csv(tmp_path / "p.csv")
    p["name"], p["city"] = ["NA", "Null"] * 20, ["02134", "00501"] * 20
    p.to_csv(tmp_path / "p.csv", index=False)
    s = pd.read_csv(tmp_path / "s.csv")
    s["title"], s["town"] = "na", ["02134", "00501"] * 4
    s.to_csv(tmp_path / "s.csv", index=False)
    ds = load_dataset("csv", tmp_path)
    assert ds.primary.identifiers[:2].tolist() == [["na", "02134"], ["null", "00501"]]
    assert ds.secondaries["s"].identifiers[0].tolist() == ["na", "02134"]
    p.loc[6, "city"] = None  # a blank cell: a missing identifier, named by its file line (header = 1)
    p.to_csv(tmp_path / "p.csv", index=False)
    with pytest.raises(DatasetError, match=r"p.csv, line 8, column 'city': an empty cell is no identifier"):
        load_dataset("csv", tmp_path)


def test_the_metric_key_is_checked_and_used_for_linkage(tmp_path):
    from app.vfl.linking import metric_of

    write_strings(tmp_path, 'metric = "jaro_winkler"')
    ds = load_dataset("csv", tmp_path)
    assert ds.metric == "jaro_winkler" and metric_of(ds) == "jaro_winkler"
    write_strings(tmp_path)
    assert metric_of(load_dataset("csv", tmp_path)) == DEFAULT_STRING_METRIC
    write_strings(tmp_path, 'metric = "euclidean"')
    with pytest.raises(DatasetError, match="metric 'euclidean' is for numeric identifiers; string identifiers take"):
        load_dataset("csv", tmp_path)
    write_strings(tmp_path, 'metric = "cosine"')
    with pytest.raises(DatasetError, match=r"metric 'cosine' is not a linkage metric; .*'jaro_winkler'"):
        load_dataset("csv", tmp_path)


# ---------------------------------------------------------------------------- the example folders


def test_the_housing_example_loads_and_trains(tmp_path):
    ds = load_dataset("csv", EXAMPLES / "housing")
    assert ds.task == "regression" and sorted(ds.secondaries) == ["listings"]
    assert ds.primary.id_names == ("lat", "lon") and "price" not in ds.primary.feature_names
    cfg = RunConfig.of(
        dataset="csv", data_dir=str(EXAMPLES / "housing"), k=5, epochs=1, batch_size=64, out_dir=str(tmp_path / "runs")
    )
    assert np.isfinite(run_experiment(cfg, tmp_path / "run")["test"]["rmse"])


def test_the_digits_example_has_entity_ids_and_partial_overlap():
    ds = load_dataset("csv", EXAMPLES / "digits")
    data = entity_data(ds)
    assert data.parties == ["left", "right"] and data.n_classes == 10 and ds.primary.n_features == 0
    for p in data.parties:  # 32 pixel columns each, less those constant on every image (blank edges)
        names = ds.secondaries[p].feature_names
        assert 28 <= len(names) == data.blocks[p].shape[1] and all(n.startswith("px_") for n in names)
    both = data.held["left"] & data.held["right"]
    assert 0.2 < both.mean() < 0.8 and not data.held["left"].all() and not data.held["right"].all()


@pytest.mark.parametrize("name", ["housing", "digits"])
def test_make_data_reproduces_the_shipped_example(name, tmp_path, monkeypatch):
    folder = EXAMPLES / name
    monkeypatch.setattr(sys, "argv", ["make_data.py", str(tmp_path)])
    runpy.run_path(str(folder / "make_data.py"), run_name="__main__")
    shipped = sorted(p.name for p in folder.glob("*.csv"))
    assert shipped and sorted(p.name for p in tmp_path.glob("*.csv")) == shipped
    for f in shipped:
        assert (tmp_path / f).read_bytes() == (folder / f).read_bytes(), f
    assert sum(p.stat().st_size for p in EXAMPLES.rglob("*") if p.is_file()) < 500_000


def test_the_run_folder_records_the_split_by_the_files_lines(tmp_path):
    """split.csv names every primary row's part by its line in the user's file, so a user can
    rebuild the run's train / validation / test sets for their own baseline (docs/own-data.md)."""
    import hashlib
    import json

    cfg = RunConfig.of(
        dataset="csv",
        data_dir=str(EXAMPLES / "housing"),
        k=3,
        epochs=1,
        batch_size=64,
        n_rows=150,
        seed=3,
        out_dir=str(tmp_path / "runs"),
    )
    run_experiment(cfg, tmp_path / "run")
    split = pd.read_csv(tmp_path / "run" / "split.csv")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (tmp_path / "run" / "split.csv").stat().st_mode & 0o777 == 0o600
    assert summary["split"]["sha256"] == hashlib.sha256((tmp_path / "run" / "split.csv").read_bytes()).hexdigest()
    assert "seed 3" in summary["split"]["rule"]
    assert len(split) == 150 and set(split["part"]) == {"train", "val", "test"}
    assert summary["split"]["sizes"] == {**split["part"].value_counts().to_dict(), "unused": 0}
    assert split["source_line"].is_unique and split["source_line"].min() >= 2
    ds = load_dataset("csv", EXAMPLES / "housing", DatasetOptions(seed=3, n_rows=150))
    sales = pd.read_csv(EXAMPLES / "housing" / "sales.csv")  # the file's line L is data row L - 2
    np.testing.assert_allclose(sales["price"].to_numpy()[split["source_line"] - 2], ds.labels, rtol=1e-6)
    for part in ("train", "val", "test"):
        assert np.array_equal(split.loc[split["part"] == part, "row"], getattr(ds.split, part))


def test_fedsim_attn_records_its_attention_by_rank_and_report_plots_it(tmp_path):
    """Issue 29: metrics.jsonl carries fedsim_attn's mean attention weight per similarity rank
    (K + 1 numbers summing to 1, the null slot last); the paper's fedsim records none; `fedsim
    report` draws it beside the weight gate."""
    import json

    from fedsim.report import one_run

    base = dict(
        dataset="csv",
        data_dir=str(EXAMPLES / "housing"),
        k=4,
        epochs=2,
        batch_size=64,
        n_rows=200,
        out_dir=str(tmp_path / "runs"),
    )
    run_experiment(RunConfig.of(**base, method="fedsim_attn"), tmp_path / "attn")
    run_experiment(RunConfig.of(**base, method="fedsim"), tmp_path / "paper")
    rows = [json.loads(line) for line in (tmp_path / "attn" / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        (weights,) = row["attention"].values()
        assert len(weights) == 4 + 1 and abs(sum(weights) - 1) < 1e-4  # six-digit rounding of 5 numbers
    assert all(
        json.loads(line)["attention"] == {} for line in (tmp_path / "paper" / "metrics.jsonl").read_text().splitlines()
    )
    assert one_run(tmp_path / "attn") == 0 and one_run(tmp_path / "paper") == 0
    for run in ("attn", "paper"):
        assert (tmp_path / run / "learning_curve.png").stat().st_size > 0
        assert (tmp_path / run / "weight_gate.png").stat().st_size > 0
