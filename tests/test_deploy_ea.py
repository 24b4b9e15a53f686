"""Entity Augmentation on a real deployment on loopback (SuperLink + one SuperNode per guest, TLS
and SuperNode authentication) on the organisations' own CSVs (examples/digits: each image named by
the same id in every file): the guests' ids meet the label holder's in a private set intersection
(app/entity_aug/id_exchange.py), the run is trained through `flwr run` against the deployment, each
guest's state and its plan kept in its own folder (node config), and predicted through the same
SuperNodes by the label holder's own ids.

Oracle: the deployed run equals the same run config trained in process, step by step (float64),
and the test entities predicted as new get the outputs training's evaluation computed at its best
epoch (as tests/test_predict_ea_flower.py for the simulation)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app.config import RunConfig
from app.entity_aug.parties import ea_data
from deploy import commands as deploy
from fedsim.cli import main
from tests.test_deploy import _down
from tests.test_predict_ea import _evaluated_test, _trained

pytestmark = pytest.mark.slow

# the steps go over the direct transport (the default); the deployment's start, the handshake and
# predict's Flower run are most of the time, so the run is a few steps: 300 rows, one epoch
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits"
VALUES = dict(dataset="csv", data_dir=str(EXAMPLE), n_rows=300, mode="entity-aug", epochs=1)


def test_entity_augmentation_trains_and_predicts_on_a_deployment_as_in_one_process(tmp_path, monkeypatch, capsys):
    root = tmp_path / "dep"
    dep = deploy.up(root, "csv", str(EXAMPLE))
    try:
        assert dep.secure and sorted(dep.nodes) == ["left", "right"]
        run_config = {k.replace("_", "-"): v for k, v in VALUES.items()} | {"dtype": "float64", "run-name": "ea"}
        r = deploy.flwr_run(dep, run_config, timeout=900)
        run = root / "runs" / "ea"
        assert (run / "summary.json").exists(), (r.stdout + r.stderr)[-5000:]
        summary = json.loads((run / "summary.json").read_text())
        from app.kept import kept_attempt, party_kept_file

        for guest in dep.parties:  # each guest's best-epoch state on its own disk, none in the primary's run
            assert (dep.party_dir(guest) / "models" / "ea" / guest / party_kept_file(kept_attempt(run))).exists()
            assert not (run / guest).exists()

        assert (run / "id_matches.npz").exists()  # the exchange's result, kept for predict
        data = ea_data(RunConfig.of(**VALUES, dtype="float64"))
        test = data.entity_ids[data.split.test]  # the label holder's own ids
        pd.DataFrame({"image_id": test}).to_csv(tmp_path / "ids.csv", index=False)
        args = [
            "predict",
            str(run),
            str(tmp_path / "ids.csv"),
            "--out",
            str(tmp_path / "p.csv"),
            "--id-column",
            "image_id",
        ]
        assert main([*args, "--deployment", str(root)]) == 0, capsys.readouterr().err[-3000:]
        got = pd.read_csv(tmp_path / "p.csv")
        assert list(got["image_id"]) == list(test)
        proba = got[[c for c in got.columns if c.startswith("p_")]].to_numpy()
    finally:
        _down(root)

    _, twin, seen = _trained(tmp_path / "twin", VALUES, "float64", monkeypatch)  # the same run, in process
    assert summary["steps"] == twin["steps"] > 0 and summary["exchange"]["bytes_up"] > 0
    np.testing.assert_allclose(  # deployed == one process, step by step (float64)
        np.load(run / "step_losses.npy"), np.load(tmp_path / "twin" / "run" / "step_losses.npy"), rtol=1e-9, atol=1e-12
    )
    assert twin["best_epoch"] == summary["best_epoch"] and twin["test"] == summary["test"]
    head, evaluated = _evaluated_test(tmp_path / "twin" / "run", twin, seen)
    assert np.abs(proba - head.probabilities(evaluated)).max() <= 1e-6
