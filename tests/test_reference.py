"""Issue 17's tools: the gradient-boosting reference row and the attention-weight table."""

import numpy as np

from app.config import RunConfig
from app.modes import run_experiment
from experiments import attention_weights, reference

SMALL = dict(dataset="synthetic", n_rows=600, sigma_cf=0.1, k=6, batch_size=32)


def test_reference_chooses_k_and_iterations_on_validation_and_reports_test_there(tmp_path):
    row = reference.reference(RunConfig(**SMALL, out_dir=str(tmp_path)), max_iter=30)
    assert row["k"] in (1, 5, 6, 10) and 1 <= row["iterations"] <= 30 and row["metric"] == "accuracy"
    assert 0.4 < row["val"] <= 1 and 0.4 < row["test"] <= 1


def test_attention_weights_of_a_trained_run_sum_to_one_and_find_the_true_rows(tmp_path):
    cfg = RunConfig(**SMALL, method="fedsim_attn", epochs=1, dtype="float64", out_dir=str(tmp_path))
    run_experiment(cfg, tmp_path / "run")
    w, sec_rows, (ds, party, rows) = attention_weights.weights_of(tmp_path / "run")
    assert w.shape == (len(rows), 6 + 1) and np.allclose(w.sum(axis=1), 1.0)
    ranks = attention_weights.twin_rank(ds, party, rows, sec_rows)
    held = ranks >= 0
    assert held.mean() > 0.5  # sigma_cf 0.1: the true row is among the 6 nearest for most records
    assert (sec_rows[held, ranks[held]] == ds.true_match[party][rows][held]).all()
    assert "null slot" in attention_weights.table(w, ranks, "true row")
