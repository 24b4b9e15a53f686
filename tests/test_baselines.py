"""Baselines and ablations are switches of the one pipeline: each runs through the federated
protocol and equals its one-process twin; the linkage variants do what they claim."""

import numpy as np
import pytest

from app.config import RunConfig
from app.vfl.inprocess import max_param_gap, run_in_process, run_twin
from app.vfl.secondary import with_imputed_row
from linkage.job_secret import operator_secret
from linkage.pipeline import link_exact, link_known

BASE = dict(
    dataset="synthetic",
    n_rows=600,
    batch_size=32,
    sigma_cf=0.1,
    epochs=1,
    max_steps=8,
    steps_per_exchange=3,
    dtype="float64",
)  # float64: twins to 1e-9 (see test_equivalence)


@pytest.mark.parametrize("method", ["top1sim", "avgsim", "featuresim", "exact", "combine", "solo"])
def test_every_baseline_equals_its_one_process_twin(method, tmp_path):
    cfg = RunConfig.of(**BASE, k=6, method=method, out_dir=str(tmp_path))
    fed = run_in_process(cfg)
    assert np.isfinite(fed.losses).all() and len(fed.losses) == 8
    if method == "solo":
        return
    twin = run_twin(cfg)
    np.testing.assert_allclose(fed.losses, twin.losses, rtol=0, atol=1e-9)
    assert max_param_gap(fed.primary, twin.primary) < 1e-9


def test_baselines_change_only_what_they_claim():
    s = RunConfig.of(dataset="synthetic", method="top1sim").resolve()
    assert s.k == 1 and s.model.merge == "avg" and s.model.uniform_weights and not s.model.sort_gate
    f = RunConfig.of(dataset="synthetic", method="featuresim").resolve()
    assert f.k == 100 and f.model.sim_feature
    ablation = RunConfig.of(dataset="hdb", weight_gate=False).resolve()
    assert ablation.model.merge == "cnn" and not ablation.model.weight_gate and ablation.k == 50


def test_featuresim_learns_from_the_similarity(tmp_path):
    cfg = RunConfig.of(**BASE, k=6, method="featuresim", out_dir=str(tmp_path))
    run = run_in_process(cfg)
    assert float(run.primary["paths.all.sim_weight"].abs().sum()) > 0  # started at zero, moved by the gradient


def test_exact_links_copies_and_imputes_the_rest():
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 10, (50, 2))
    query = np.concatenate([base[[4, 9, 9]], base[:2] + 0.5])  # 3 exact copies, 2 near misses
    res = link_exact(query, {"s": base}, secret=operator_secret(0, "test"))
    rows = res.secondaries["s"].row_of_token[res.primary.tokens["s"][:, 0]]
    np.testing.assert_array_equal(rows, [4, 9, 9, 50, 50])  # row 50 = the imputed mean row
    feats = rng.normal(size=(50, 3))
    full = with_imputed_row(feats, res.secondaries["s"].row_of_token, "s")
    np.testing.assert_allclose(full[50], feats.mean(0))
    assert with_imputed_row(feats, np.array([3, 0, 49]), "s") is feats  # a chain's map: no extra row
    with pytest.raises(ValueError, match="maps tokens to row 52 but the party has 50 rows"):
        with_imputed_row(feats, np.array([0, 52]), "s")


def test_combine_uses_the_true_rows_and_needs_them(tmp_path):
    res = link_known({"s": np.array([2, 0, 1])}, {"s": 3}, secret=operator_secret(0, "test"), job_id="t")
    np.testing.assert_array_equal(res.secondaries["s"].row_of_token[res.primary.tokens["s"][:, 0]], [2, 0, 1])
    with pytest.raises(ValueError, match="needs the true alignment"):
        run_in_process(
            RunConfig.of(dataset="hdb", n_rows=500, method="combine", epochs=1, max_steps=1, out_dir=str(tmp_path))
        )


def test_paper_hyperparameters_per_method_are_opt_in_and_overridable():
    """hparams="paper": the reference's baseline scripts (fedsim-reference.md, App. E)."""
    top1 = RunConfig.of(dataset="hdb", method="top1sim", hparams="paper").resolve()
    assert (top1.batch_size, top1.lr, top1.weight_decay) == (4096, 1e-2, 1e-5)
    avg = RunConfig.of(dataset="game", method="avgsim", hparams="paper").resolve()
    assert (avg.batch_size, avg.lr, avg.model.agg_hidden) == (128, 1e-3, (400,))
    assert RunConfig.of(dataset="hdb", method="top1sim", hparams="paper", lr=0.5).resolve().lr == 0.5
    same = RunConfig.of(dataset="hdb", method="top1sim").resolve()  # the default: the dataset's FedSim values
    assert (same.batch_size, same.lr) == (128, 1e-3)
    fedsim = RunConfig.of(dataset="hdb", hparams="paper").resolve()
    assert fedsim == RunConfig.of(dataset="hdb").resolve()  # FedSim's own values are the dataset's
