"""Predict for entities with a kept Entity Augmentation run (app/entity_aug/predict.py), in process.

Oracle: the test split's entities, predicted as if they were new, get the outputs that the
training run's evaluation computed at its best epoch (recorded while it trained), whose metric
summary.json reports; float64 to 1e-6 (measured: 0), float32 to 1e-6 (measured: 0 for the test
split as evaluated, 6e-8 for other subsets and orders of it); bad input is refused by name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

import strategies.entity_aug.model as ea_model
from app.config import RunConfig
from app.entity_aug.kept import Keeper
from app.entity_aug.parties import ea_data, overlap_parts
from app.entity_aug.predict import main, predict_ea_in_process
from app.kept import MANIFEST, KeptError
from app.modes import run_experiment
from app.run_status import RunFailed
from strategies.heads import TaskHead
from strategies.records import EpochRecord

CASES = {  # the smallest configs of tests/test_entity_aug.py and tests/test_run_record.py
    "digits": dict(dataset="digits", n_rows=300, mode="entity-aug", epochs=4, ea_variant="augment", overlap=0.1),
    "synthetic-primary-block": dict(dataset="synthetic", n_rows=300, mode="entity-aug", epochs=4, batch_size=32),
}


def _trained(tmp_path, values: dict, dtype: str, monkeypatch) -> tuple[RunConfig, dict, list[torch.Tensor]]:
    """Train in process, recording every output of the primary's evaluation (per epoch: validation, then test)."""
    cfg = RunConfig.of(**values, dtype=dtype, out_dir=str(tmp_path / "out"))
    seen, outputs = [], ea_model.PrimaryParty.outputs

    def spy(self, acts, rows):
        out = outputs(self, acts, rows)
        seen.append(out.clone())
        return out

    with monkeypatch.context() as m:
        m.setattr(ea_model.PrimaryParty, "outputs", spy)
        summary = run_experiment(cfg, tmp_path / "run")
    assert len(seen) == 2 * summary["epochs_run"]  # one chunk of validation, one of test, per epoch
    return cfg, summary, seen


def _evaluated_test(run, summary: dict, seen: list[torch.Tensor]) -> tuple[TaskHead, torch.Tensor]:
    """The head and the test outputs training's evaluation computed at the best epoch."""
    head = TaskHead(**json.loads((run / "kept" / MANIFEST).read_text())["head"])
    return head, seen[2 * summary["best_epoch"] + 1]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_test_split_predicted_as_new_gets_the_best_epochs_evaluation(case, tmp_path, monkeypatch):
    cfg, summary, seen = _trained(tmp_path, CASES[case], "float64", monkeypatch)
    test = ea_data(cfg).split.test
    head, evaluated = _evaluated_test(tmp_path / "run", summary, seen)
    labels = ea_data(cfg).labels[test]
    assert head.evaluation(evaluated, labels) == summary["test"]  # the recording is the reported epoch
    got = predict_ea_in_process(tmp_path / "run", test)
    assert got.best_epoch == summary["best_epoch"]
    assert np.abs(got.proba - head.probabilities(evaluated)).max() <= 1e-6
    np.testing.assert_allclose(got.values, head.predict(evaluated), rtol=0, atol=1e-6)
    for name, value in summary["test"].items():
        assert head.metrics(got.values, labels, got.proba)[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    assert set(got.seconds) == {"prepare", "embed", "forward"}


def test_float32_runs_agree_to_float32_precision(tmp_path, monkeypatch):
    # undefended: the case was chosen for a trajectory whose best epoch is not the last (the
    # default's noise moves it; predict == evaluation at the default: the test above, float64)
    values = {**CASES["synthetic-primary-block"], "exchange_privacy": "off"}
    cfg, summary, seen = _trained(tmp_path, values, "float32", monkeypatch)
    test = ea_data(cfg).split.test
    head, evaluated = _evaluated_test(tmp_path / "run", summary, seen)
    want = head.probabilities(evaluated)
    got = predict_ea_in_process(tmp_path / "run", test).proba
    assert np.abs(got - want).max() <= 1e-6
    assert summary["best_epoch"] < summary["epochs_run"] - 1  # this case keeps an epoch before the last:
    assert np.abs(got - head.probabilities(seen[-1])).max() > 1e-3  # not the final states
    some = np.random.default_rng(0).permutation(len(test))[:17]  # other chunks than the evaluation's
    assert np.abs(predict_ea_in_process(tmp_path / "run", test[some]).proba - want[some]).max() <= 1e-6


def test_the_keeper_keeps_the_best_validation_epoch_and_the_first_on_ties():
    model = torch.nn.Linear(2, 1)
    keeper = Keeper(TaskHead("multiclass", 3))
    for epoch, accuracy in enumerate([0.5, 0.7, 0.6, 0.7]):
        with torch.no_grad():
            model.weight.fill_(float(epoch))
        keeper.offer(EpochRecord(epoch, 0.0, 1, 1, 0.0, val={"accuracy": accuracy}), {"host": model})
    assert keeper.best.epoch == 1 and float(keeper.states["host"]["weight"].max()) == 1.0


# ---------------------------------------------------------------------------- refusals


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A finished tiny run (digits: secondaries left and right), trained once for the refusal tests."""
    tmp = tmp_path_factory.mktemp("ea-predict")
    cfg = RunConfig.of(**dict(CASES["digits"], epochs=1), out_dir=str(tmp / "out"))
    run_experiment(cfg, tmp / "run")
    return cfg, tmp / "run"


@pytest.fixture
def run(trained_run, tmp_path):
    """A copy of the trained run that a test may damage."""
    shutil.copytree(trained_run[1], tmp_path / "run")
    return tmp_path / "run"


def _edit_manifest(folder, /, **changes) -> None:
    path = folder / "kept" / MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_entity_ids_every_party_does_not_hold_are_refused_by_name(trained_run, run):
    cfg = trained_run[0]
    data = ea_data(cfg)
    test = data.split.test[:3]
    with pytest.raises(KeptError, match=r"2 of 5 entity id\(s\) are not entities of the run \(0..299\): \[300, 1000\]"):
        predict_ea_in_process(run, [*test, 300, 1000])
    _, shares = overlap_parts(cfg, data)  # the training entities in one secondary's own share
    with pytest.raises(KeptError, match=r"2 entity id\(s\) are not held by every party: .*'left': 1, 'right': 1"):
        predict_ea_in_process(run, [*test, shares[0][0], shares[1][0]])
    with pytest.raises(KeptError, match=r"1 entity id\(s\) are NaN"):
        predict_ea_in_process(run, [float(test[0]), np.nan])
    with pytest.raises(KeptError, match=r"1 entity id\(s\) are not whole numbers: \[2.5\]"):
        predict_ea_in_process(run, [float(test[0]), 2.5])
    with pytest.raises(KeptError, match="entity ids must be numbers"):
        predict_ea_in_process(run, ["a", "b"])
    twice = predict_ea_in_process(run, [test[0], test[0], test[1]])  # repeated ids are fine
    np.testing.assert_array_equal(twice.proba[0], twice.proba[1])


def test_changed_data_is_refused_by_name(trained_run, run):
    meta = json.loads((run / "kept" / MANIFEST).read_text())
    _edit_manifest(run, features_sha256={**meta["features_sha256"], "right": "0" * 64})
    with pytest.raises(KeptError, match=r"party 'right': its data changed since training \(features digest"):
        predict_ea_in_process(run, [0])
    _edit_manifest(run, features_sha256=meta["features_sha256"], run={**meta["run"], "n_rows": 299})
    with pytest.raises(KeptError, match=r"party 'left': its data changed since training"):  # another subsample
        predict_ea_in_process(run, [0])


def test_a_run_without_its_kept_states_is_refused_by_name(run):
    test = [0]
    _edit_manifest(run, secondary_states="parties")  # the Flower engine's manifest: the secondaries keep their own
    with pytest.raises(KeptError, match="trained over Flower: each secondary keeps its own state"):
        predict_ea_in_process(run, test)
    _edit_manifest(run, secondary_states="run", mode="vfl")
    with pytest.raises(KeptError, match="kept a federation of mode 'vfl', not 'entity-aug'"):
        predict_ea_in_process(run, test)
    _edit_manifest(run, mode="entity-aug")
    (run / "kept" / "right.pt").unlink()
    with pytest.raises(KeptError, match=r"lacks the state of \['right'\]"):
        predict_ea_in_process(run, test)
    shutil.rmtree(run / "kept")
    with pytest.raises(KeptError, match="has no kept federation"):
        predict_ea_in_process(run, test)


def _written_before_issue_30(folder) -> dict:
    """The manifest as a run kept before issue 30 wrote it: "guests" and "guest_states"."""
    path = folder / "kept" / MANIFEST
    meta = json.loads(path.read_text())
    old = {k: v for k, v in meta.items() if k not in ("secondaries", "secondary_states")}
    path.write_text(json.dumps({**old, "guests": meta["secondaries"], "guest_states": meta["secondary_states"]}))
    return meta


def test_a_run_kept_before_the_rename_still_predicts(trained_run, run):
    test = ea_data(trained_run[0]).split.test[:3]
    want = predict_ea_in_process(trained_run[1], test)
    meta = _written_before_issue_30(run)
    assert meta["secondaries"] == ["left", "right"] and meta["secondary_states"] == "run"
    got = predict_ea_in_process(run, test)
    np.testing.assert_array_equal(got.proba, want.proba)
    _edit_manifest(run, guest_states="guests")  # an old Flower run: each guest kept its own
    with pytest.raises(KeptError, match=r"each secondary keeps its own state.*secondaries \['left', 'right'\]"):
        predict_ea_in_process(run, test)


def test_a_run_that_did_not_finish_is_refused(run, tmp_path):
    status = json.loads((run / "status.json").read_text())
    (run / "status.json").write_text(json.dumps({**status, "state": "running"}))
    with pytest.raises(RunFailed, match="did not finish: its status is 'running'"):
        predict_ea_in_process(run, [0])
    with pytest.raises(RunFailed, match="did not start"):
        predict_ea_in_process(tmp_path / "never-ran", [0])


def test_the_command_writes_the_csv_or_nothing(trained_run, run, tmp_path, capsys):
    test = ea_data(trained_run[0]).split.test[:4]
    ids, out = tmp_path / "ids.csv", tmp_path / "p.csv"
    pd.DataFrame({"id": test}).to_csv(ids, index=False)
    assert main([str(run), "--ids", str(ids), "--ids-column", "id", "--out", str(out)]) == 0
    got = pd.read_csv(out)
    assert list(got.columns) == ["id", "prediction", *[f"p_{c}" for c in range(10)]]
    want = predict_ea_in_process(run, test)
    assert got["id"].tolist() == test.tolist() and got["prediction"].tolist() == want.values.tolist()
    np.testing.assert_array_equal(got[[f"p_{c}" for c in range(10)]].to_numpy(want.proba.dtype), want.proba)
    pd.DataFrame({"id": [*test, 300]}).to_csv(ids, index=False)
    before = out.read_bytes()
    assert main([str(run), "--ids", str(ids), "--ids-column", "id", "--out", str(out)]) == 2
    err = capsys.readouterr().err  # issue 29: the older output stays byte for byte, and the message says so
    assert "'300' (line 6): not an entity of the run (0..299)" in err, err
    ids.write_text(ids.read_text().replace("\n", "\n\n", 1))  # a blank line below the header
    assert main([str(run), "--ids", str(ids), "--ids-column", "id", "--out", str(out)]) == 2
    assert "'300' (line 7): not an entity of the run" in capsys.readouterr().err  # the line an editor shows
    assert "was left untouched" in err and out.read_bytes() == before
    assert main([str(run), "--ids", str(ids), "--out", str(ids)]) == 2
    assert "--out names the input file" in capsys.readouterr().err and ids.exists()


def test_declared_entity_ids_are_read_for_predict_as_training_reads_them(tmp_path):
    """Training strips each id (datasets/entity_ids.py); predict took ' img0003' as it stood and
    refused it as no entity of the run. A blank id is still refused."""
    from app.entity_aug.predict_ids import read_ids

    path = tmp_path / "ids.csv"
    path.write_text('id\n img0003\n"img0004 "\n007\n')
    assert read_ids(path, "id", declared=True).tolist() == ["img0003", "img0004", "7"]  # 007 is 7, as in training
    path.write_text('id\nimg0003\n"  "\n')
    with pytest.raises(KeptError, match="empty value"):
        read_ids(path, "id", declared=True)
