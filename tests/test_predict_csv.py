"""Predict from a user's CSV of new records into a CSV (app/vfl/predict_csv.py): the same
predictions as from the loaded arrays, the explanation's columns, and refusals that leave no
output behind."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from app.config import RunConfig
from app.data import load_data
from app.modes import run_experiment
from app.vfl.predict import Prediction, predict_in_process
from app.vfl.predict_csv import main, table
from tests.test_byo import write_parties

K = 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("byo")
    write_parties(folder)
    cfg = RunConfig(dataset="csv", data_dir=str(folder), k=K, epochs=2, batch_size=32, out_dir=str(folder / "out"))
    run_experiment(cfg, folder / "run")
    return folder, load_data(cfg)


def _new_csv(folder, rows, edit=lambda d: d):
    df = pd.read_csv(folder / "sales.csv").iloc[rows].drop(columns=["price"]).assign(flat_id=[f"f{i}" for i in rows])
    edit(df).to_csv(folder / "new.csv", index=False)
    return folder / "new.csv"


def test_a_csv_of_new_records_gets_the_arrays_predictions_and_an_explanation(trained, capsys):
    folder, ds = trained
    test = ds.split.test
    new = _new_csv(folder, test)
    assert main([str(folder / "run"), str(new), "--out", str(folder / "pred.csv"), "--id-column", "flat_id",
                 "--explain"]) == 0
    out = pd.read_csv(folder / "pred.csv")
    expected = predict_in_process(folder / "run", ds.primary.features[test], ds.primary.identifiers[test])
    assert list(out["flat_id"]) == [f"f{i}" for i in test]
    np.testing.assert_allclose(out["prediction"], expected.values, rtol=1e-6)
    assert [c for c in out.columns if c.startswith("shops_")] == [  # the default method, fedsim_attn
        f"shops_{what}_{k}" for k in range(1, K + 1) for what in ("token", "similarity", "weight", "attention")] + [
        "shops_attention_null"]
    np.testing.assert_array_equal(out[[f"shops_token_{k}" for k in range(1, K + 1)]], expected.linkage.links["shops"].tokens)
    assert f"{len(test)} predictions" in capsys.readouterr().out


def test_an_attention_models_explanation_names_each_weight_by_its_neighbour():
    """fedsim_attn: after each neighbour's token, similarity and gate weight comes its attention
    weight, and the null slot's last (columns built from planted arrays, so any mix-up shows)."""
    links = {"shops": SimpleNamespace(tokens=np.array([[7, 8], [9, 6]]), sims=np.array([[0.5, 0.1], [0.2, 0.3]]))}
    pred = Prediction(np.array([1.0, 2.0]), None, SimpleNamespace(links=links), {"shops": np.full((2, 2), 0.5)}, 0, {},
                      {"shops": np.array([[0.7, 0.2, 0.1], [0.0, 0.4, 0.6]])})
    out = table(np.array(["a", "b"]), "id", pred, explain=True)
    assert list(out.columns) == ["id", "prediction"] + [
        f"shops_{what}_{k}" for k in (1, 2) for what in ("token", "similarity", "weight", "attention")] + [
        "shops_attention_null"]
    np.testing.assert_array_equal(out[["shops_attention_1", "shops_attention_2", "shops_attention_null"]],
                                  pred.attention["shops"])
    np.testing.assert_array_equal(out[["shops_token_1", "shops_token_2"]], links["shops"].tokens)


@pytest.mark.parametrize("edit, unknown, message", [
    (lambda d: d.drop(columns=["rooms"]), "ignore", r"missing column\(s\) \['rooms'\]"),
    (lambda d: d.drop(columns=["lat"]), "ignore", r"missing column\(s\) \['lat'\]"),
    (lambda d: d.assign(lat=np.where(np.arange(len(d)) == 1, np.nan, d["lat"])), "ignore", "NaN/empty identifiers"),
    (lambda d: d.assign(type=["zz"] + list(d["type"][1:])), "refuse", "column 'type' holds 1 value"),
])
def test_bad_new_records_fail_by_name_and_leave_no_output(trained, capsys, edit, unknown, message):
    folder, ds = trained
    (folder / "pred.csv").write_text("an older output\n")
    new = _new_csv(folder, ds.split.test[:10], edit)
    assert main([str(folder / "run"), str(new), "--out", str(folder / "pred.csv"), "--unknown", unknown]) == 1
    assert not (folder / "pred.csv").exists()
    import re
    assert re.search(message, capsys.readouterr().err)


def test_an_unseen_category_is_counted_and_predicted_without_its_one_hot(trained, capsys):
    folder, ds = trained
    new = _new_csv(folder, ds.split.test[:10], lambda d: d.assign(type=["zz"] + list(d["type"][1:])))
    assert main([str(folder / "run"), str(new), "--out", str(folder / "pred.csv")]) == 0
    assert "unseen categories: {'type': 1}" in capsys.readouterr().err
    assert len(pd.read_csv(folder / "pred.csv")) == 10
