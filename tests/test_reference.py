"""Issue 17's tools: the gradient-boosting reference row and the attention-weight table."""

import numpy as np

from app.config import RunConfig
from app.modes import run_experiment
from experiments import attention_weights, reference

SMALL = dict(dataset="synthetic", n_rows=600, sigma_cf=0.1, k=6, batch_size=32)


def test_reference_chooses_k_and_iterations_on_validation_and_reports_test_there(tmp_path):
    row = reference.reference(RunConfig.of(**SMALL, out_dir=str(tmp_path)), max_iter=30)
    assert row["k"] in (1, 5, 6, 10) and 1 <= row["iterations"] <= 30 and row["metric"] == "accuracy"
    assert 0.4 < row["val"] <= 1 and 0.4 < row["test"] <= 1


def test_the_reference_command_runs_per_seed_and_appends_its_rows(tmp_path, capsys):
    """`python -m experiments.reference` itself (it failed on the grouped RunConfig: TypeError,
    "RunConfig has no key(s) ['data', ...]"), two seeds into a CSV of the caller's."""
    out = tmp_path / "ref.csv"
    argv = ["synthetic", "--seeds", "0", "1", "--max-iter", "20", "--out", str(out)]
    assert reference.main(argv + ["-c", "n-rows=600", "-c", "sigma-cf=0.1", "-c", f"out-dir={tmp_path}"]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and lines[0].startswith("dataset,") and "seed 1:" in capsys.readouterr().out


def test_attention_weights_of_a_trained_run_sum_to_one_and_find_the_true_rows(tmp_path):
    cfg = RunConfig.of(**SMALL, method="fedsim_attn", epochs=1, dtype="float64", out_dir=str(tmp_path))
    run_experiment(cfg, tmp_path / "run")
    w, sec_rows, (ds, party, rows) = attention_weights.weights_of(tmp_path / "run")
    assert w.shape == (len(rows), 6 + 1) and np.allclose(w.sum(axis=1), 1.0)
    ranks = attention_weights.twin_rank(ds, party, rows, sec_rows)
    held = ranks >= 0
    assert held.mean() > 0.5  # sigma_cf 0.1: the true row is among the 6 nearest for most records
    assert (sec_rows[held, ranks[held]] == ds.true_match[party][rows][held]).all()
    assert "null slot" in attention_weights.table(w, ranks, "true row")


def test_paired_tables_keep_datasets_apart_and_pair_by_seed(tmp_path, capsys):
    """A sweep's results.csv holds every dataset: one dataset's rows never stand in for
    another's (they did: the same variant and seed overwrote each other)."""
    from experiments import paired

    rows = ["dataset,variant,seed,metric,test,val"]
    for seed in (0, 1):
        rows += [
            f"house,fedsim_attn,{seed},rmse,{300 + seed},{310 + seed}",
            f"house,avgsim,{seed},rmse,{305 + 2 * seed},1",
            f"frog,fedsim_attn,{seed},accuracy,0.9,0.9",
            f"frog,avgsim,{seed},accuracy,0.8,0.8",
        ]
    (tmp_path / "results.csv").write_text("\n".join(rows) + "\n")
    paired.main([str(tmp_path / "results.csv"), "--dataset", "house"])
    out = capsys.readouterr().out
    assert "test rmse" in out and "accuracy" not in out
    assert "+5.0000, +6.0000 | 2 of 2" in out  # lower RMSE is better: avgsim minus ours, per seed
