"""Predict from a user's CSV of new records into a CSV (app/vfl/predict_csv.py): the same
predictions as from the loaded arrays, the explanation's columns, and refusals that leave no
output behind."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from app.config import RunConfig
from app.data import load_data
from app.modes import run_experiment
from app.vfl.predict import predict_in_process
from app.vfl.predict_csv import main
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
    assert [c for c in out.columns if c.startswith("shops_")] == [
        f"shops_{what}_{k}" for k in range(1, K + 1) for what in ("token", "similarity", "weight")]
    np.testing.assert_array_equal(out[[f"shops_token_{k}" for k in range(1, K + 1)]], expected.linkage.links["shops"].tokens)
    assert f"{len(test)} predictions" in capsys.readouterr().out


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
