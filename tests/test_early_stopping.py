"""Own data does not need our defaults (issue 16): early stopping with a patience, the same in
every engine, in process, after a resume and for Entity Augmentation; the run's warnings; its
progress.json. The validation metric is scripted per epoch so the stopping epoch is known."""

from __future__ import annotations

import json
import math
import threading
import time

import numpy as np
import pandas as pd
import pytest
import torch

from app import modes
from app.config import RunConfig
from app.run_files import PROGRESS
from app.run_record import ProgressFile, read_metrics
from app.vfl import checkpoint
from app.vfl import server as primary
from strategies.entity_aug import model as ea_model
from strategies.heads import TaskHead
from strategies.records import EpochRecord, best_epoch, early_stop, stopping
from strategies.stop_rule import StopRule
from strategies.vfl import protocol
from tests.test_byo import SPEC, write_parties
from tests.test_checkpoint import Crash
from tests.test_checkpoint import _run as run_checkpointed

DOWN_THEN_FLAT = [3.0, 2.0, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0, 3.1, 3.2, 3.3, 3.4, 3.5, 3.6]  # rmse per epoch: best 1
REGRESSION = TaskHead("regression")


def plan(epochs: int, patience: int) -> StopRule:
    """A plan's stopping rule (either mode's TrainPlan holds one)."""
    return StopRule(epochs, patience)


def recs(vals: list[float], key: str = "rmse") -> list[EpochRecord]:
    return [EpochRecord(e, 0.0, 1, 0, 0.0, val={key: v}) for e, v in enumerate(vals)]


class Script:
    """Stands in for an evaluation: epoch e's validation (and test) metric is ``values[e]``; the
    loops evaluate validation then test once per epoch. ``at(epoch)`` sets where it goes on."""

    def __init__(self, key: str, values: list[float]) -> None:
        self.key, self.values, self.calls = key, values, 0

    def at(self, epoch: int) -> "Script":
        self.calls = 2 * epoch
        return self

    def __call__(self, *args, **kwargs) -> dict[str, float]:
        v = self.values[min(self.calls // 2, len(self.values) - 1)]
        self.calls += 1
        if isinstance(v, tuple):  # a classifier's (accuracy, log loss)
            return {"accuracy": v[0], "log_loss": v[1]}
        return {self.key: v} if self.key != "accuracy" else {"accuracy": v, "log_loss": 1.0 - v}

    def pair(self, *args, **kwargs) -> tuple[dict[str, float], dict]:
        """As VFL's protocol.evaluate answers: (the metrics, the predictions it kept: none here)."""
        return self(*args, **kwargs), {}


@pytest.fixture
def csv_data(tmp_path):
    write_parties(tmp_path)
    return dict(dataset="csv", data_dir=str(tmp_path), k=4, batch_size=64, out_dir=str(tmp_path / "runs"))


# ---------------------------------------------------------------------------- the rule


def test_stopping_is_a_function_of_the_records():
    r = recs(DOWN_THEN_FLAT[:5])  # best epoch 1, then 3 epochs without improvement
    assert early_stop(r, REGRESSION, 3) and not early_stop(r, REGRESSION, 4) and not early_stop(r, REGRESSION, 0)
    assert not early_stop(r[:4], REGRESSION, 3)
    s = stopping(r, REGRESSION, plan(200, 3))
    assert (s["patience"], s["max_epochs"], s["epochs_run"], s["stopped_early"]) == (3, 200, 5, True)
    assert "best epoch 1" in s["reason"]
    assert (
        not stopping(r, REGRESSION, plan(5, 0))["stopped_early"]
        and "fixed epochs" in stopping(r, REGRESSION, plan(5, 0))["reason"]
    )
    assert not stopping(r, REGRESSION, plan(5, 3))["stopped_early"]  # it stopped at the maximum all the same
    assert early_stop(recs([0.5, 0.6, 0.6], "accuracy"), TaskHead("binary"), 1)  # a tie is no improvement


# a binary run on own data (200 validation rows): accuracy wobbles by chance (one row is 0.005,
# its sampling error ~0.03) while the log loss of a model still learning keeps falling
WOBBLY = [(0.67, 0.69), (0.60, 0.68), (0.62, 0.66), (0.61, 0.64), (0.64, 0.62), (0.66, 0.60), (0.70, 0.58)]


def test_a_classifier_that_stops_early_selects_on_its_log_loss_not_its_wobbling_accuracy():
    """Before: a binary run on a held-out own-data set stopped at epoch 14 with its best accuracy
    at epoch 4 (0.67, a lucky value) while its loss was still falling; trained on, it reached 0.84."""
    records = [EpochRecord(e, 0.0, 1, 0, 0.0, val={"accuracy": a, "log_loss": ll}) for e, (a, ll) in enumerate(WOBBLY)]
    y = np.array([0, 1, 1, 0])
    stops = TaskHead.fit("binary", y, 2, early_stopping=True)
    fixed = TaskHead.fit("binary", y, 2)  # fixed epochs (the paper's presets): the key metric, as before
    assert (stops.selection_key, fixed.selection_key) == ("log_loss", "accuracy")
    assert early_stop(records[:4], fixed, 3) and not early_stop(records[:4], stops, 3)
    assert best_epoch(records, stops).epoch == 6 and best_epoch(records[:6], fixed).epoch == 0
    assert "no better validation log_loss" in stopping(records + records[:3], stops, plan(200, 3))["reason"]
    assert TaskHead.fit("regression", np.array([1.0, 2.0]), 1, early_stopping=True).selection_key == "rmse"
    older = [EpochRecord(e, 0.0, 1, 0, 0.0, val={"accuracy": a}) for e, (a, _) in enumerate(WOBBLY[:3])]  # no log loss
    assert best_epoch(older + records[3:], stops).epoch == 6  # an older checkpoint's epochs resume, on accuracy


def test_the_evaluations_log_loss_is_the_labels_mean_negative_log_likelihood():
    binary, logits = TaskHead("binary", 2), np.array([0.0, 2.0, -1.0])
    p = 1 / (1 + np.exp(-logits))
    got = binary.evaluation(torch.tensor(logits[:, None]), np.array([1, 1, 0]))
    assert got["log_loss"] == pytest.approx(-np.mean(np.log([p[0], p[1], 1 - p[2]])))
    assert got["accuracy"] == binary.metrics(p, np.array([1, 1, 0]))["accuracy"] == pytest.approx(2 / 3)
    sure = binary.evaluation(torch.tensor([[40.0]], dtype=torch.float32), np.array([0]))  # p(y=0) rounds to 0
    assert sure["log_loss"] == pytest.approx(-np.log(1e-7))  # floored: finite, the mistake counted
    multi, logits = TaskHead("multiclass", 3), np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    prob = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    got = multi.evaluation(torch.tensor(logits), np.array([0, 1]))
    assert got["log_loss"] == pytest.approx(-np.mean(np.log([prob[0, 0], prob[1, 1]]))) and got["accuracy"] == 0.5
    assert set(TaskHead("regression").evaluation(torch.zeros(2, 1), np.array([0.0, 1.0]))) == {"rmse", "r2"}


def test_a_diverged_epoch_is_never_the_best_and_the_constant_predictor_uses_training_labels_only():
    assert REGRESSION.better(1.0, math.nan) and not REGRESSION.better(math.nan, 1.0)
    assert not early_stop(recs([math.nan, 2.0]), REGRESSION, 1)  # before: a NaN first epoch stayed "best"
    y_train, y_val = np.array([1.0, 2.0, 3.0]), np.array([10.0, 10.0])
    assert REGRESSION.constant_metrics(y_train, y_val)["rmse"] == pytest.approx(8.0)  # the training mean, 2
    assert TaskHead("binary").constant_metrics(np.array([1, 1, 0]), np.array([0, 1]))["accuracy"] == 0.5
    assert TaskHead("multiclass", 3).constant_metrics(np.array([2, 2, 0]), np.array([2, 1, 2, 2]))["accuracy"] == 0.75


# ---------------------------------------------------------------------------- every engine stops alike


def test_own_data_trains_until_validation_stops_improving_in_every_engine(csv_data, tmp_path, monkeypatch):
    """Before: the csv path trained the demo's 2 epochs with hdb's hyperparameters, without a word."""
    script = Script("rmse", DOWN_THEN_FLAT)
    monkeypatch.setattr(protocol, "evaluate", script.pair)
    inproc = modes.run_experiment(RunConfig.of(**csv_data, method="solo"), tmp_path / "inprocess")
    script.at(0)
    flower = primary.run_primary(None, RunConfig.of(**csv_data, method="solo", run_name="flower"))  # Solo: no Grid
    for s in (inproc, flower):
        assert s["stopping"] == {
            "patience": 10,
            "max_epochs": 200,
            "max_minutes": 0.0,
            "epochs_run": 12,
            "stopped_early": True,
            "reason": s["stopping"]["reason"],
            "selected_on": "rmse",
        }
        assert s["best_epoch"] == 1 and s["warnings"] == []
        assert s["hyperparameters"]["epochs"] == {
            "value": 200,
            "source": "fallback: early stopping — dataset has no tuned defaults",
        }
        assert s["hyperparameters"]["lr"]["source"] == "fallback: hdb's defaults — dataset has no tuned defaults"
    config = json.loads((tmp_path / "inprocess" / "config.json").read_text())
    assert config["hyperparameters"]["patience"]["value"] == 10 and config["resolved"]["patience"] == 10
    # a resume of the stopped run trains no further epoch (its checkpoint holds the records)
    resumed = primary.run_primary(None, RunConfig.of(**csv_data, method="solo", run_name="flower", resume=True))
    assert resumed["epochs_run"] == 12 and resumed["steps"] == flower["steps"]


def test_a_binary_run_on_own_data_stops_on_its_log_loss_in_every_engine(tmp_path, monkeypatch):
    write_parties(tmp_path, spec=SPEC.replace('"regression"', '"binary"').replace('"price"', '"dear"'))
    sales = pd.read_csv(tmp_path / "sales.csv")
    sales.assign(dear=(sales["price"] > sales["price"].median()).astype(int)).to_csv(
        tmp_path / "sales.csv", index=False
    )
    data = dict(dataset="csv", data_dir=str(tmp_path), k=4, batch_size=64, out_dir=str(tmp_path / "runs"), patience=3)
    script = Script("", [*WOBBLY, *[(0.65, 0.60)] * 5])  # loss best at 6; accuracy best at 0, then 3 worse
    monkeypatch.setattr(protocol, "evaluate", script.pair)
    inproc = modes.run_experiment(RunConfig.of(**data, method="solo"), tmp_path / "inprocess")
    script.at(0)
    flower = primary.run_primary(None, RunConfig.of(**data, method="solo", run_name="flower"))
    for s in (inproc, flower):
        assert (s["best_epoch"], s["epochs_run"], s["stopping"]["selected_on"]) == (6, 10, "log_loss")
        assert s["val"] == {"accuracy": 0.70, "log_loss": 0.58}


def test_a_resumed_run_stops_at_the_epoch_the_uninterrupted_run_stopped(csv_data, tmp_path, monkeypatch):
    cfg = RunConfig.of(**csv_data, patience=2, epochs=9, steps_per_exchange=1)
    script = Script("rmse", DOWN_THEN_FLAT)
    monkeypatch.setattr(protocol, "evaluate", script.pair)
    full, full_losses, _, _ = run_checkpointed(cfg, tmp_path / "full")
    assert len(full) == 4  # best epoch 1, then 2 without improvement
    script.at(0)
    with pytest.raises(Crash):
        run_checkpointed(cfg, tmp_path / "ckpt", crash_after=2)  # epochs 0-2 checkpointed, not stopped yet
    script.at(3)
    resumed, losses, _, _ = run_checkpointed(cfg, tmp_path / "ckpt", resume=True)
    assert [r.epoch for r in resumed] == [0, 1, 2, 3] and len(losses) == len(full_losses)
    assert checkpoint.read_manifest(tmp_path / "ckpt").epoch == 3


def test_entity_augmentation_stops_early_too(tmp_path, monkeypatch):
    monkeypatch.setattr(ea_model, "evaluate", Script("accuracy", [0.5, 0.7, 0.6, 0.6, 0.65, 0.7, 0.8]))
    cfg = RunConfig.of(dataset="digits", n_rows=300, mode="entity-aug", epochs=7, patience=3, out_dir=str(tmp_path))
    s = modes.run_experiment(cfg, tmp_path / "run")
    assert (s["best_epoch"], s["epochs_run"], s["stopping"]["stopped_early"]) == (1, 5, True)
    assert s["hyperparameters"]["patience"] == {"value": 3, "source": "run config"}
    assert s["hyperparameters"]["lr"]["source"].startswith("dataset default (digits")
    progress = json.loads((tmp_path / "run" / PROGRESS).read_text())
    assert (progress["phase"], progress["epoch"], progress["best_epoch"], progress["max_epochs"]) == ("done", 4, 1, 7)


# ---------------------------------------------------------------------------- warnings


def test_a_run_says_when_its_best_epoch_is_the_last_or_no_better_than_a_constant(csv_data, tmp_path, monkeypatch):
    monkeypatch.setattr(protocol, "evaluate", Script("rmse", [3e9, 2e9, 1e9]).pair)
    s = modes.run_experiment(RunConfig.of(**csv_data, method="solo", epochs=3, patience=0), tmp_path / "run")
    assert s["stopping"]["reason"] == "fixed epochs: all 3 ran (patience 0)"
    assert s["constant_predictor"]["prediction"] == "the training labels' mean"
    assert 100 < s["constant_predictor"]["val"]["rmse"] < 1000  # the prices' spread, not the scripted value
    assert len(s["warnings"]) == 2
    assert "the best validation epoch is the last one run (2)" in s["warnings"][0]
    assert "no better than a constant predictor" in s["warnings"][1]


# ---------------------------------------------------------------------------- progress.json


def test_progress_json_is_rewritten_at_most_once_an_interval_and_ends_done(tmp_path):
    p = ProgressFile(tmp_path, 5, interval=0.2)
    assert json.loads((tmp_path / PROGRESS).read_text())["phase"] == "linkage"  # written at once
    t0 = time.time()
    while time.time() - t0 < 0.5:
        p.step("training", 0, 3, 10, 0.25)
    p.epoch(EpochRecord(0, 0.2, 10, 0, 0.1, val={"rmse": 1.5}), 0)
    p.step("evaluation", 1, 10, 10, math.nan)
    p.close(done=True)
    assert p.writes <= 1 + 0.5 / 0.2 + 2  # the first, one per interval, the last
    body = json.loads((tmp_path / PROGRESS).read_text())
    assert set(body) == {"phase", "epoch", "max_epochs", "step", "steps_per_epoch", "loss", "val", "best_epoch", "time"}
    assert (
        body["phase"],
        body["epoch"],
        body["step"],
        body["steps_per_epoch"],
        body["loss"],
        body["val"],
        body["best_epoch"],
        body["max_epochs"],
    ) == ("done", 1, 10, 10, None, {"rmse": 1.5}, 0, 5)
    assert not any(t.name == "progress.json" for t in threading.enumerate())


def test_a_running_run_shows_its_phase_epoch_and_step(csv_data, tmp_path, monkeypatch):
    seen = []  # every state the file would show (its writes are throttled, its state is not)
    real = ProgressFile.update

    def watch(self, **fields):
        real(self, **fields)
        seen.append(dict(self.state))

    monkeypatch.setattr(ProgressFile, "update", watch)
    s = modes.run_experiment(RunConfig.of(**csv_data, epochs=2, patience=0), tmp_path / "run")
    assert [v["phase"] for v in seen][-1] == "done"
    per_epoch = s["steps"] // 2
    for epoch in (0, 1):
        steps = [v["step"] for v in seen if v["phase"] == "training" and v["epoch"] == epoch]
        assert steps == list(range(1, per_epoch + 1))
        assert any(v["phase"] == "evaluation" and v["epoch"] == epoch for v in seen)
    assert all(v["max_epochs"] == 2 and v["steps_per_epoch"] == per_epoch for v in seen if v["phase"] == "training")
    last = read_metrics(tmp_path / "run")[-1]
    assert seen[-1]["best_epoch"] == s["best_epoch"] and seen[-1]["val"] == last["val"]  # the last epoch's
    assert json.loads((tmp_path / "run" / PROGRESS).read_text()) == seen[-1]
