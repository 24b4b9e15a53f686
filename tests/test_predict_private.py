"""Predict for runs trained in the private mode (encoding = "bloom": the parties link keyed
Bloom / FEDERAL filters by Hamming distance): the new records are encoded with the run's own
key, derived from the training data as training derived it, so the test split predicted as new
records gets the best epoch's test metric (the oracle of tests/test_predict.py)."""

from __future__ import annotations

import numpy as np
import pytest

from app.config import RunConfig
from app.data import load_data
from app.modes import run_experiment
from app.vfl.kept import load_kept
from app.vfl.predict import predict_in_process
from strategies.heads import TaskHead

BLOOM = {  # numbers (FEDERAL filters of coordinates) and strings (q-gram Bloom filters of titles)
    "numbers": dict(dataset="house3", parties="airbnb_a,airbnb_b", n_rows=400, k=5),
    "strings": dict(dataset="game", n_rows=400, k=5),
}


@pytest.mark.parametrize("kind", sorted(BLOOM))
def test_a_bloom_runs_test_split_predicted_as_new_gets_its_test_metric(kind, tmp_path):
    values = dict(BLOOM[kind], encoding="bloom", batch_size=32, epochs=2, exchange_report=False, dtype="float64")
    cfg = RunConfig.of(**values, out_dir=str(tmp_path / "out"))
    summary = run_experiment(cfg, tmp_path / "run")
    ds = load_data(cfg)
    test = ds.split.test
    got = predict_in_process(tmp_path / "run", ds.primary.features[test], ds.primary.identifiers[test])
    assert got.linkage.metric == "hamming"  # linked on the filters, as training was
    metrics = TaskHead(**load_kept(tmp_path / "run")[0]["head"]).metrics(got.values, ds.labels[test], got.proba)
    for name, value in summary["test"].items():
        assert metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    assert np.isfinite(got.values).all()


def test_a_chain_runs_test_split_predicted_as_new_gets_its_test_metric(tmp_path):
    """The paper's appendix C layout: the primary links top-K to an anchor secondary, every other
    secondary one-to-one to the anchor's rows; new records are queried against the anchor and
    every party resolves the anchor's tokens with the map it already holds."""
    values = dict(
        dataset="house3",
        parties="airbnb_a,airbnb_b",
        n_rows=400,
        k=5,
        layout="chain",
        batch_size=32,
        epochs=2,
        exchange_report=False,
        dtype="float64",
    )
    cfg = RunConfig.of(**values, out_dir=str(tmp_path / "out"))
    summary = run_experiment(cfg, tmp_path / "run")
    ds = load_data(cfg)
    test = ds.split.test
    got = predict_in_process(tmp_path / "run", ds.primary.features[test], ds.primary.identifiers[test])
    assert got.linkage.layout == "chain"
    np.testing.assert_array_equal(got.linkage.links["airbnb_a"].tokens, got.linkage.links["airbnb_b"].tokens)
    metrics = TaskHead(**load_kept(tmp_path / "run")[0]["head"]).metrics(got.values, ds.labels[test], got.proba)
    for name, value in summary["test"].items():
        assert metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
