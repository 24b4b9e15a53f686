"""Datasets: planted truth in the synthetic set, the shipped loaders, the registry, and bad input."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from datasets import DatasetError, load_dataset, split_primary
from datasets.registry import DatasetOptions
from datasets.tables import Columns, party_table
from linkage.pipeline import topk_euclidean


def test_split_is_seeded_disjoint_and_7_1_2():
    s = split_primary(1000, seed=3)
    assert (len(s.train), len(s.val), len(s.test)) == (700, 100, 200)
    assert len(np.intersect1d(s.train, s.val)) == 0 and len(np.intersect1d(s.train, s.test)) == 0
    assert sorted(np.concatenate([s.train, s.val, s.test]).tolist()) == list(range(1000))
    np.testing.assert_array_equal(split_primary(1000, seed=3).train, s.train)
    assert not np.array_equal(split_primary(1000, seed=4).train, s.train)


def test_synthetic_identifiers_are_informative_and_link_to_the_true_rows():
    ds = load_dataset("synthetic", options=DatasetOptions(seed=0, n_rows=500, sigma_cf=0.0))
    sec = ds.secondaries["secondary"]
    assert ds.primary.identifiers.shape == (500, 5) and ds.task == "binary"
    # planted truth: without noise every record's nearest secondary is its own entity
    _, idx = topk_euclidean(ds.primary.identifiers, sec.identifiers, 1)
    np.testing.assert_array_equal(idx[:, 0], ds.true_match["secondary"])
    # the identifiers come from informative columns: they separate the classes
    ids, y = ds.primary.identifiers, ds.labels
    gap = np.abs(ids[y == 1].mean(0) - ids[y == 0].mean(0)) / ids.std(0)
    assert gap.max() > 0.1
    # the secondary's rows are not in the primary's order
    assert not np.array_equal(ds.true_match["secondary"], np.arange(500))


def test_synthetic_noise_on_identifiers_breaks_exact_linkage():
    ds = load_dataset("synthetic", options=DatasetOptions(seed=0, n_rows=2000, sigma_cf=0.5))
    sec = ds.secondaries["secondary"]
    _, idx = topk_euclidean(ds.primary.identifiers, sec.identifiers, 1)
    hit = (idx[:, 0] == ds.true_match["secondary"]).mean()
    assert 0.05 < hit < 0.99


def test_hdb_parties_features_and_identifiers():
    ds = load_dataset("hdb", options=DatasetOptions(seed=0, n_rows=3000))
    assert ds.task == "regression" and ds.primary.n_rows == 3000
    school = ds.secondaries["school"]
    assert school.n_rows == 165 and school.n_features == 4  # vacancy rates; constant n_places dropped
    assert not {"latitude", "longitude"} & set(ds.primary.feature_names)  # identifiers are not features
    assert ds.primary.id_names == ("latitude", "longitude")
    assert 100 < np.median(ds.labels) < 1000  # thousands of SGD


def test_frog_is_split_like_the_paper():
    ds = load_dataset("frog", options=DatasetOptions(seed=0))
    assert ds.primary.identifiers.shape[1] == 16 and ds.n_classes == 10
    assert ds.primary.n_features == 3 and ds.secondaries["secondary"].n_features == 3


def test_unknown_dataset_is_named():
    with pytest.raises(
        DatasetError,
        match=r"unknown dataset 'nope'; known datasets: \['credit', 'csv', 'digits', 'frog', "
        r"'game', 'handwritten', 'hdb', 'house', 'house3', 'parkinsons', 'synthetic'\]",
    ):
        load_dataset("nope")


DATASETS_DIR = Path(__file__).resolve().parents[1] / "datasets"


def _loader_functions() -> set[tuple[str, str]]:
    """(module, name) of every top-level ``def f(data_dir, opts)`` under datasets/: the loaders."""
    found = set()
    for path in sorted(DATASETS_DIR.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and [a.arg for a in node.args.args] == ["data_dir", "opts"]:
                found.add((f"datasets.{path.stem}", node.name))
    return found


def test_no_module_registers_itself_with_a_decorator():
    for path in sorted(DATASETS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                assert node.name != "register", f"{path.name} defines register()"
                for dec in node.decorator_list:
                    fn = dec.func if isinstance(dec, ast.Call) else dec
                    name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", "")
                    assert name != "register", f"{path.name}: {node.name} is registered by a decorator"
            if isinstance(node, ast.ImportFrom) and path.stem not in ("__init__", "registry"):
                assert node.module != "datasets.registry", f"{path.name} imports the registry"


def test_registry_is_a_plain_dict_of_every_loader_full_on_import_alone():
    # a fresh interpreter that imports datasets.registry and calls nothing
    code = (
        "import json, datasets.registry as r; print(json.dumps([type(r.DATASETS).__name__, "
        "[[k, f.__module__, f.__name__] for k, f in r.DATASETS.items()]]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=DATASETS_DIR.parent, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    kind, entries = json.loads(out.splitlines()[-1])
    assert kind == "dict"
    assert [k for k, _, _ in entries] == [
        "csv",
        "frog",
        "game",
        "hdb",
        "house",
        "house3",
        "credit",
        "parkinsons",
        "handwritten",
        "digits",
        "synthetic",
    ]
    assert {(m, f) for _, m, f in entries} == _loader_functions()  # every loader module's dataset, each once
    assert len({(m, f) for _, m, f in entries}) == len(entries)


def test_missing_data_folder_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDSIM_DATA_DIR", raising=False)
    import datasets.options as options

    monkeypatch.setattr(options, "__file__", str(tmp_path / "x" / "options.py"))
    monkeypatch.chdir(tmp_path)  # the working directory is searched too
    with pytest.raises(DatasetError, match="data folder 'frog' not found"):
        load_dataset("frog", data_dir=tmp_path)


def test_party_table_refuses_missing_columns_and_nan_identifiers():
    df = pd.DataFrame({"lat": [1.0, np.nan, 2.0], "lon": [1.0, 2.0, 3.0], "f": [1.0, 2.0, 3.0]})
    with pytest.raises(DatasetError, match=r"party 'p': missing column\(s\) \['price'\]"):
        party_table("p", df, Columns(["lat", "lon"], "numeric", numeric=["price"]))
    with pytest.raises(
        DatasetError,
        match=r"party 'p': 1 row\(s\) with NaN/empty identifiers \['lat', 'lon'\] \(column 'lat', first rows: \[1\]\)",
    ):
        party_table("p", df, Columns(["lat", "lon"], "numeric", numeric=["f"]))
    with pytest.raises(DatasetError, match="party 'p': zero rows"):
        party_table("p", df.iloc[:0], Columns(["lon"], "numeric", numeric=["f"]))
    words = pd.DataFrame({"lat": ["a", "b"], "lon": [1.0, 2.0], "f": [1.0, 2.0]})
    with pytest.raises(DatasetError, match="are not numbers"):
        party_table("p", words, Columns(["lat", "lon"], "numeric", numeric=["f"]))


def test_party_table_one_hot_and_standardises_on_fit_rows():
    df = pd.DataFrame({"k": [0.0, 1, 2, 3], "f": [1.0, 2, 3, 10], "c": ["a", "b", "a", "a"], "z": [5.0] * 4})
    t = party_table(
        "p", df, Columns(["k"], "numeric", numeric=["f", "z"], categorical=["c"]), fit_rows=np.array([0, 1, 2])
    )
    assert t.feature_names == ("f", "c_a", "c_b")  # constant z dropped
    np.testing.assert_allclose(t.features[:3, 0].mean(), 0.0, atol=1e-6)


class _Asked(Exception):
    pass


@pytest.mark.parametrize("name", ["frog", "game", "hdb", "house", "house3", "credit", "parkinsons", "handwritten"])
def test_data_folder_names_the_folder_each_loader_reads(name, monkeypatch):
    """deploy's operator copies data_folder(name) into a party's home: it must be what the loader asks for."""
    from datasets import frog, game, hdb, house, overlap
    from datasets.registry import DATASETS, data_folder

    def asked(subdir, data_dir):
        raise _Asked(subdir)

    for module in (frog, game, hdb, house, overlap):
        monkeypatch.setattr(module, "find_data_dir", asked)
    with pytest.raises(_Asked) as got:
        DATASETS[name](None, DatasetOptions(n_rows=100))
    assert str(got.value) == data_folder(name)
