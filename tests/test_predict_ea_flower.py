"""Entity Augmentation trained and predicted through `flwr run` (issue 29 item 3): `fedsim train
--mode entity-aug` on the default engine (a Flower simulation) keeps each guest's best-epoch
state in the guest's own folder, and `fedsim predict` runs the apps' predict mode.

Oracle: the test entities predicted as new get the outputs the run's evaluation computed at its
best epoch. Those are recorded from the same run config trained in process (the Flower run
equals it step by step, checked here too), within the in-process predict test's 1e-6
(tests/test_predict_ea.py); and their accuracy is exactly the test metric summary.json reports."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from app.config import RunConfig
from app.entity_aug.kept import load_kept
from app.entity_aug.parties import ea_data
from app.kept import KeptError, kept_attempt, party_kept_file
from fedsim.cli import main
from tests.test_predict_ea import _evaluated_test, _trained

VALUES = dict(dataset="digits", n_rows=300, mode="entity-aug", epochs=3, ea_variant="augment", overlap=0.1)


@pytest.mark.slow
def test_a_run_trained_through_flower_predicts_through_flower_as_it_evaluated(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs"
    rc = main(
        [
            "train",
            "--mode",
            "entity-aug",
            "--dataset",
            "digits",
            "--epochs",
            "3",
            "--out-dir",
            str(runs),
            "--run-name",
            "ea",
            "-c",
            "n-rows=300",
            "-c",
            "overlap=0.1",
            "-c",
            "dtype='float64'",
            "-c",  # Flower's messages: the direct transport's twin is tests/test_deploy_ea.py's
            "transport='flower'",
        ]
    )
    run = runs / "ea"
    assert rc == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["engine"] == "flower"
    for guest in ("left", "right"):  # each guest kept its own best epoch, beside the host's run folder
        assert (run / guest / party_kept_file(kept_attempt(run))).exists() and kept_attempt(run)
    with pytest.raises(KeptError, match="predict it over Flower"):
        load_kept(run)  # in process cannot: the guests' states are theirs

    cfg = RunConfig.of(**VALUES, dtype="float64", out_dir=str(runs))
    test = ea_data(cfg).split.test
    pd.DataFrame({"image": test}).to_csv(tmp_path / "ids.csv", index=False)
    (tmp_path / "p.csv").write_text("an older output\n")
    rc = main(
        ["predict", str(run), str(tmp_path / "ids.csv"), "--out", str(tmp_path / "p.csv"), "--id-column", "image"]
    )
    assert rc == 0, capsys.readouterr().err[-3000:]
    got = pd.read_csv(tmp_path / "p.csv")
    assert list(got["image"]) == list(test)
    proba = got[[c for c in got.columns if c.startswith("p_")]].to_numpy()

    _, twin, seen = _trained(tmp_path / "twin", VALUES, "float64", monkeypatch)  # the same run, in process
    assert summary["steps"] == twin["steps"] > 0 and summary["exchange"]["bytes_up"] > 0  # guests' messages crossed
    np.testing.assert_allclose(  # Flower == one process, step by step (float64)
        np.load(run / "step_losses.npy"), np.load(tmp_path / "twin" / "run" / "step_losses.npy"), rtol=1e-9, atol=1e-12
    )
    assert twin["best_epoch"] == summary["best_epoch"] and twin["test"] == summary["test"]
    head, evaluated = _evaluated_test(tmp_path / "twin" / "run", twin, seen)
    assert np.abs(proba - head.probabilities(evaluated)).max() <= 1e-6
    labels = ea_data(cfg).labels[test]
    assert head.metrics(got["prediction"].to_numpy(), labels, proba) == pytest.approx(summary["test"], rel=1e-9)
