"""Predict for new records with a kept federation (app/vfl/predict.py), in process.

Oracle: the test split's primary records, predicted as if they were new (tau = 1), get the
predictions the training run's evaluation made at its best epoch, whose metric summary.json
reports; bad input is refused by name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from app.config import RunConfig
from app.data import load_data
from app.kept import KeptError
from app.modes import run_experiment
from app.run_status import RunFailed
from app.vfl.kept import load_kept
from app.vfl.predict import predict_in_process
from linkage.contracts import LinkageError
from strategies.heads import TaskHead

# exchange_report off: the oracle is about predict, and the report's feature inversion (an MLP on
# each secondary's records) was most of a case's time (ple-missing: 15 of 18 s alone)
TWO_SECONDARIES = dict(
    dataset="house3", parties="airbnb_a,airbnb_b", n_rows=400, k=5, batch_size=32, epochs=2, exchange_report=False
)
CASES = {  # FedSim with the CNN merge gate (house3's default), and a baseline
    "fedsim-cnn": dict(TWO_SECONDARIES, method="fedsim", merge="cnn"),
    "avgsim": dict(TWO_SECONDARIES, method="avgsim"),
    "fedsim-attn": dict(TWO_SECONDARIES, method="fedsim_attn"),  # the improved model (issue 17)
    # the quantile input recipe: every party's numeric inputs through their training quantiles
    "fedsim-attn-quantile": dict(TWO_SECONDARIES, method="fedsim_attn", input_scale="quantile"),
    # ple, and a 0/1 "was missing" feature beside each imputed column (house3's sales and listings have NaN)
    "fedsim-attn-ple-missing": dict(TWO_SECONDARIES, method="fedsim_attn", input_scale="ple", missing="indicator"),
}


def _trained(tmp_path, values: dict, dtype: str = "float64"):
    cfg = RunConfig.of(**values, dtype=dtype, out_dir=str(tmp_path / "out"))
    summary = run_experiment(cfg, tmp_path / "run")
    return cfg, summary, load_data(cfg)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_test_split_predicted_as_new_gets_the_best_epochs_test_metric(case, tmp_path):
    cfg, summary, ds = _trained(tmp_path, CASES[case])
    test = ds.split.test
    got = predict_in_process(tmp_path / "run", ds.primary.features[test], ds.primary.identifiers[test], explain=True)
    head = TaskHead(**load_kept(tmp_path / "run")[0]["head"])
    metrics = head.metrics(got.values, ds.labels[test], got.proba)
    assert got.best_epoch == summary["best_epoch"]
    for name, value in summary["test"].items():
        assert metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    assert set(got.linkage.links) == {"airbnb_a", "airbnb_b"}
    if case.startswith("fedsim-attn"):  # the explanation carries the attention's weights: per record they sum to 1
        assert {p: w.shape for p, w in got.attention.items()} == {
            "airbnb_a": (len(test), 6),
            "airbnb_b": (len(test), 6),
        }
        np.testing.assert_allclose(got.attention["airbnb_a"].sum(axis=1), 1.0, atol=1e-12)
    else:
        assert got.attention == {}


def test_float32_runs_agree_to_float32_precision(tmp_path):
    cfg, summary, ds = _trained(tmp_path, CASES["fedsim-cnn"], dtype="float32")
    test = ds.split.test
    got = predict_in_process(tmp_path / "run", ds.primary.features[test], ds.primary.identifiers[test])
    metrics = TaskHead(**load_kept(tmp_path / "run")[0]["head"]).metrics(got.values, ds.labels[test], got.proba)
    assert metrics["rmse"] == pytest.approx(summary["test"]["rmse"], rel=1e-4)


def test_bad_input_is_refused_by_name(tmp_path):
    cfg, summary, ds = _trained(tmp_path, dict(CASES["avgsim"], epochs=1))
    run, x, ids = tmp_path / "run", ds.primary.features[:5], ds.primary.identifiers[:5]
    with pytest.raises(KeptError, match=r"features of shape \(5, 3\); the primary was trained on"):
        predict_in_process(run, x[:, :3], ids)
    with pytest.raises(KeptError, match="1 row\\(s\\) with non-finite features"):
        predict_in_process(run, np.where(np.arange(5)[:, None] == 2, np.nan, x), ids)
    with pytest.raises(LinkageError, match="NaN"):
        predict_in_process(run, x, np.where(np.arange(5)[:, None] == 1, np.nan, ids))
    manifest = run / "kept" / "federation.json"
    original = manifest.read_text()
    meta = json.loads(original)
    meta["secondaries"]["airbnb_b"]["features_sha256"] = "0" * 64  # as if its data had changed since
    manifest.write_text(json.dumps(meta))
    with pytest.raises(KeptError, match=r"party 'airbnb_b': its data changed since training \(features"):
        predict_in_process(run, x, ids)
    meta = json.loads(original)
    meta["primary"]["identifiers_sha256"] = "0" * 64  # as if its identifiers had been corrected since
    manifest.write_text(json.dumps(meta))
    with pytest.raises(KeptError, match=r"party 'primary': its data changed since training \(identifiers"):
        predict_in_process(run, x, ids)
    meta = json.loads(original)
    sort_off = RunConfig.of(**{**meta["run"], "method": "fedsim", "merge": "cnn", "sort_gate": False})
    manifest.write_text(json.dumps({**meta, "run": sort_off.flat()}))
    with pytest.raises(KeptError, match="no order-dependent merge without the sort gate"):
        predict_in_process(run, x, ids)
    manifest.write_text(json.dumps({**meta, "run": {**meta["run"], "linkage_dir": str(tmp_path)}}))
    with pytest.raises(
        KeptError, match="linked by the linkage service .* pass the answer as run-config predict-linkage"
    ):
        predict_in_process(run, x, ids)
    manifest.write_text(original)
    keys = list((tmp_path / "out" / "linkage-service").glob("*.key"))
    assert len(keys) == 1
    keys[0].unlink()
    with pytest.raises(LinkageError, match="its secret .* is missing"):
        predict_in_process(run, x, ids)
    shutil.rmtree(run / "kept")
    with pytest.raises(KeptError, match="has no kept federation"):
        predict_in_process(run, x, ids)
    with pytest.raises(RunFailed):
        predict_in_process(tmp_path / "never-ran", x, ids)


def test_a_failed_run_under_an_old_name_keeps_the_finished_runs_kept_federation_with_it(tmp_path):
    """The kept federation belongs to the finished run: a failed rerun under its name puts both back
    together (app/run_status.py), so predict keeps using the run whose evaluation it matches."""
    _trained(tmp_path, dict(CASES["avgsim"], epochs=1))
    federation = (tmp_path / "run" / "kept" / "federation.json").read_bytes()
    with pytest.raises(LinkageError):
        run_experiment(
            RunConfig.of(**dict(CASES["avgsim"], k=100_000), out_dir=str(tmp_path / "out")), tmp_path / "run"
        )
    assert (tmp_path / "run" / "kept" / "federation.json").read_bytes() == federation
    assert "LinkageError" in (tmp_path / "run" / "last-attempt.json").read_text()
    # and the finished run put back is usable: predict and the report take it (the attempt stays in last-attempt.json)
    ds = load_data(RunConfig.of(**CASES["avgsim"]))
    test = ds.split.test[:20]
    pred = predict_in_process(tmp_path / "run", ds.primary.features[test], ds.primary.identifiers[test])
    assert len(pred.values) == 20
    from fedsim.report import one_run

    assert one_run(tmp_path / "run") == 0


def test_the_keeper_keeps_the_best_validation_epoch_and_the_first_on_ties():
    from app.vfl.kept import Keeper
    from strategies.records import EpochRecord

    model = torch.nn.Linear(2, 1)
    keeper = Keeper(TaskHead("regression"))
    for epoch, rmse in enumerate([0.5, 0.3, 0.4, 0.3]):
        with torch.no_grad():
            model.weight.fill_(float(epoch))
        keeper.offer(EpochRecord(epoch, 0.0, 1, 1, 0.0, val={"rmse": rmse}), {"primary": model})
    assert keeper.best.epoch == 1 and float(keeper.states["primary"]["weight"].max()) == 1.0


def test_with_noise_the_test_split_still_gets_the_best_epochs_test_metric(tmp_path):
    """tau < 1: a training record queried again gets the noise the job released for it."""
    from tests.test_byo import write_parties

    (tmp_path / "data").mkdir()
    write_parties(tmp_path / "data")
    values = dict(dataset="csv", data_dir=str(tmp_path / "data"), k=4, epochs=2, batch_size=32, tau=0.9)
    cfg, summary, ds = _trained(tmp_path, values)
    test = ds.split.test
    got = predict_in_process(tmp_path / "run", ds.primary.features[test], ds.primary.identifiers[test])
    assert got.linkage.links["shops"].sigma > 0
    metrics = TaskHead(**load_kept(tmp_path / "run")[0]["head"]).metrics(got.values, ds.labels[test], got.proba)
    assert metrics["rmse"] == pytest.approx(summary["test"]["rmse"], rel=1e-9)
