"""Ensembles (issue 34): run-config `member` trains another member on the same split, and
predict averages kept members (app/vfl/ensemble.py, `fedsim predict ... --member RUN`).

Oracles: member 0 is the run as before (its seeds are the run's); a member's split is its
seed's while its model draws differ; the ensemble's prediction is the members' mean, and the
ensemble of one is the run itself; the command writes what the arrays give. (The twin oracle
for a member: tests/test_equivalence.py `hdb-fedsim-attn-member`.)"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from app.config import ConfigError, RunConfig
from app.data import load_data
from app.kept import KeptError
from app.modes import run_experiment
from app.vfl.ensemble import average, predict_ensemble
from app.vfl.inprocess import max_param_gap, run_in_process
from app.vfl.predict import Prediction, predict_in_process
from experiments.ensemble import main as score_main
from fedsim.cli import main as fedsim_main
from tests.test_byo import write_parties

TINY = dict(dataset="hdb", n_rows=600, k=5, batch_size=32, epochs=1, max_steps=6, dtype="float64")


def test_member_0_is_the_run_and_a_member_keeps_the_split_but_not_the_model(tmp_path):
    runs = {m: RunConfig.of(**TINY, member=m, out_dir=str(tmp_path)) for m in (0, 1, 2)}
    assert runs[0].train.model_seed == runs[0].train.seed == 0  # member 0: every draw as before
    assert len({cfg.train.model_seed for cfg in runs.values()}) == 3
    splits = [load_data(cfg).split for cfg in runs.values()]
    for split in splits[1:]:
        for part in ("train", "val", "test"):
            np.testing.assert_array_equal(getattr(split, part), getattr(splits[0], part))
    trained = {m: run_in_process(cfg) for m, cfg in runs.items()}
    assert max_param_gap(trained[1].primary, trained[2].primary) > 1e-3  # its own initial weights
    assert max_param_gap(trained[1].secondaries["school"], trained[2].secondaries["school"]) > 1e-3  # each party's
    assert np.abs(trained[0].losses - trained[1].losses).max() > 1e-6
    again = run_in_process(runs[1])
    np.testing.assert_array_equal(again.losses, trained[1].losses)  # a member is reproducible


def test_a_member_is_refused_where_it_means_nothing():
    with pytest.raises(ConfigError, match="'member'"):
        RunConfig.from_flower({"dataset": "hdb", "member": -1})
    with pytest.raises(ConfigError, match="'member' 1 applies to mode 'vfl'"):
        RunConfig.from_flower({"dataset": "hdb", "mode": "entity-aug", "member": 1})


@pytest.fixture(scope="module")
def members(tmp_path_factory):
    """Three kept members of one csv federation (seed 0) and a run of another seed."""
    folder = tmp_path_factory.mktemp("ensemble")
    write_parties(folder)
    base = dict(dataset="csv", data_dir=str(folder), k=4, epochs=2, batch_size=32, out_dir=str(folder / "out"))
    noisy = {"tau": 0.9, "out_dir": str(folder / "noisy")}  # with noise: one linkage release, one secret
    runs = {"m0": {}, "m1": {"member": 1}, "m2": {"member": 2}, "seed1": {"seed": 1}}
    runs |= {"n0": noisy, "n1": {**noisy, "member": 1}, "n2": {**noisy, "member": 2, "out_dir": str(folder / "x")}}
    for name, extra in runs.items():
        run_experiment(RunConfig.of(**{**base, **extra}), folder / name / "s0")  # a sweep's layout
    return folder, load_data(RunConfig.of(**base))


def _run(folder, name):
    return folder / name / "s0"


def test_the_ensemble_predicts_the_members_mean_and_one_member_is_the_run(members):
    folder, ds = members
    test = ds.split.test
    x, ids = ds.primary.features[test], ds.primary.identifiers[test]
    runs = [_run(folder, m) for m in ("m0", "m1", "m2")]
    alone = [predict_in_process(r, x, ids).values for r in runs]
    assert min(np.abs(a - alone[0]).max() for a in alone[1:]) > 1e-3  # the members differ
    got, each = predict_ensemble(runs, x, ids)
    np.testing.assert_allclose(got.values, np.mean(alone, axis=0), rtol=1e-12)
    for a, member in zip(alone, each, strict=True):
        np.testing.assert_array_equal(member.values, a)
    one, _ = predict_ensemble(runs[:1], x, ids)
    np.testing.assert_array_equal(one.values, alone[0])


def test_members_of_other_data_or_named_twice_are_refused_by_name(members):
    folder, ds = members
    x, ids = ds.primary.features[:3], ds.primary.identifiers[:3]
    with pytest.raises(
        KeptError, match=r"seed1/s0 differs from .*m0/s0 in \[.*'primary features_sha256'\]: .* seed's split"
    ):
        predict_ensemble([_run(folder, "m0"), _run(folder, "seed1")], x, ids)  # another split: other fitted inputs
    with pytest.raises(KeptError, match="names a run twice"):
        predict_ensemble([_run(folder, "m0"), _run(folder, "m1"), _run(folder, "m0")], x, ids)
    shutil.copytree(_run(folder, "m0"), folder / "copy" / "s0", dirs_exist_ok=True)
    with pytest.raises(KeptError, match=r"different members .*: members \[0, 1, 0\]"):
        predict_ensemble([_run(folder, "m0"), _run(folder, "m1"), _run(folder, "copy")], x, ids)
    # with noise, a member linked under another out-dir is another noisy release of the same similarities
    got, _ = predict_ensemble([_run(folder, "n0"), _run(folder, "n1")], x, ids)
    assert np.isfinite(got.values).all()
    with pytest.raises(KeptError, match=r"n2/s0 differs from .*n0/s0 in \['out_dir'\]"):
        predict_ensemble([_run(folder, "n0"), _run(folder, "n2")], x, ids)


def test_a_member_trained_through_flower_is_named_with_the_way_to_score_it(members, tmp_path):
    """A member whose secondaries kept their models in their own folders (the Flower engine's
    manifest) cannot be scored in this process: the refusal names that member and the ways that
    work, not a duplicate member (the old message said "must be different members")."""
    import json

    folder, ds = members
    flwr = tmp_path / "flwr" / "s0"
    shutil.copytree(_run(folder, "m1"), flwr)
    manifest = flwr / "kept" / "federation.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "secondary_states": "parties"}))
    with pytest.raises(KeptError, match=r"flwr/s0'\] kept each secondary's model in that party's own folder") as e:
        predict_ensemble([_run(folder, "m0"), flwr], ds.primary.features[:3], ds.primary.identifiers[:3])
    assert "--engine inprocess" in str(e.value) and "fedsim predict" in str(e.value)
    assert "different members" not in str(e.value)


def test_classification_averages_probabilities_and_reports_as_one_model_would():
    proba = [np.array([[0.3, 0.7], [0.8, 0.2]]), np.array([[0.5, 0.5], [0.6, 0.4]])]  # (q, C) per member
    preds = [Prediction(p[:, 1], p, None, {}, 1, {}) for p in proba]
    values, mean = average(preds, "binary")
    np.testing.assert_allclose(mean, [[0.4, 0.6], [0.7, 0.3]])
    np.testing.assert_allclose(values, [0.6, 0.3])  # P(y=1), as TaskHead.predict reports a binary run
    values, _ = average(preds, "multiclass")  # a multiclass run of two classes reports the class
    np.testing.assert_array_equal(values, [1, 0])
    reg = [
        Prediction(np.array([1.0, 3.0]), None, None, {}, 1, {}),
        Prediction(np.array([3.0, 5.0]), None, None, {}, 1, {}),
    ]
    np.testing.assert_allclose(average(reg, "regression")[0], [2.0, 4.0])


def test_fedsim_predict_with_members_writes_the_ensembles_mean(members, capsys):
    folder, ds = members
    rows = np.arange(10)
    new = folder / "new.csv"
    pd.read_csv(folder / "sales.csv").iloc[rows].drop(columns=["price"]).to_csv(new, index=False)
    out = folder / "pred.csv"
    argv = ["predict", str(_run(folder, "m0")), str(new), "--out", str(out), "--member", str(_run(folder, "m1"))]
    assert fedsim_main(argv) == 0
    x, ids = ds.primary.features[rows], ds.primary.identifiers[rows]
    want = predict_ensemble([_run(folder, "m0"), _run(folder, "m1")], x, ids)[0].values
    np.testing.assert_allclose(pd.read_csv(out)["prediction"].to_numpy(), want, rtol=1e-6)
    before = out.read_bytes()
    assert fedsim_main([*argv, "--explain"]) == 2  # an explanation is per run
    assert fedsim_main([*argv, "--member", str(_run(folder, "seed1"))]) == 1  # a member of another split
    assert "seed1/s0 differs" in capsys.readouterr().err
    assert out.read_bytes() == before  # a refused or failed predict keeps the older output
    bad = pd.read_csv(new).astype({"rooms": object})
    bad.loc[3, "rooms"] = "n/a"
    bad.to_csv(new, index=False)
    assert fedsim_main([*argv, "--skip-invalid"]) == 0  # every member leaves the same record out
    kept = np.delete(rows, 3)
    assert list(pd.read_csv(out)["row"]) == list(kept)
    want = predict_ensemble([_run(folder, "m0"), _run(folder, "m1")], x[kept], ids[kept])[0].values
    np.testing.assert_allclose(pd.read_csv(out)["prediction"].to_numpy(), want, rtol=1e-6)
    assert list(pd.read_csv(folder / "pred.skipped.csv")["line"]) == [5]
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []  # no member's file left
    skipped = out.read_bytes()
    assert fedsim_main(argv) == 2 and out.read_bytes() == skipped  # without --skip-invalid: refused, kept


def test_the_scoring_script_scores_each_size_and_checks_each_member_alone(members, tmp_path, capsys):
    folder, ds = members
    variants = [str(folder / m) for m in ("m0", "m1", "m2")]
    assert score_main([*variants, "--seeds", "0", "--json", str(tmp_path / "s.json")]) == 0
    scores = json.loads((tmp_path / "s.json").read_text())["0"]
    test = ds.split.test
    runs = [_run(folder, m) for m in ("m0", "m1")]
    pair = predict_ensemble(runs, ds.primary.features[test], ds.primary.identifiers[test])[0].values
    rmse = float(np.sqrt(np.mean((pair - ds.labels[test]) ** 2)))
    assert scores["test"][0] == pytest.approx(json.loads((runs[0] / "summary.json").read_text())["test"]["rmse"])
    # float32 predictions of the same model in batches of other shapes (the scorer's, this test's) agree
    # to float32 rounding (~1e-7 relative: BLAS blocks by shape), so 1e-6, not 1e-9: it failed once at 1.0e-7
    assert scores["test"][1] == pytest.approx(rmse, rel=1e-6)
    assert len(scores["val"]) == len(scores["test"]) == 3
    own = [str(_run(folder, m)) for m in ("m0", "m1", "m2")]  # run folders as `fedsim train` leaves them
    assert score_main([*own, "--json", str(tmp_path / "own.json")]) == 0
    assert json.loads((tmp_path / "own.json").read_text()) == {"0": scores}  # the same, no sweep layout needed
    (tmp_path / "ref.csv").write_text(f"dataset,seed,test\ncsv,0,{scores['test'][2] + 1.0}\n")
    assert score_main([*variants, "--seeds", "0", "--reference", str(tmp_path / "ref.csv")]) == 0
    assert "3 member(s) minus the reference: -1.00; mean -1.00 ± 0.00, ahead in 1 of 1" in capsys.readouterr().out
    summary = _run(folder, "m1") / "summary.json"
    kept = summary.read_text()
    try:  # a member whose evaluation its kept model does not reproduce stops the script
        summary.write_text(kept.replace('"rmse": ', '"rmse": 1', 1))
        with pytest.raises(SystemExit, match="m1/s0: predicted val rmse"):
            score_main([*variants, "--seeds", "0"])
    finally:
        summary.write_text(kept)
