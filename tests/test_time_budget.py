"""A time budget for training (run-config ``max-minutes``): a run stops after the epoch in which
its training and evaluation reached the budget, reports its best epoch so far and says why it
stopped; the budget is a function of the records (each epoch's seconds), so a resumed run counts
the time spent before it. No wall-time assertion: the runs below take a budget of a nanosecond,
which any epoch spends."""

from __future__ import annotations

import pytest

from app import modes
from app.config import RunConfig
from app.config_keys import ConfigError
from strategies.heads import TaskHead
from strategies.records import EpochRecord, finished, out_of_time, stopping
from strategies.stop_rule import StopRule

REGRESSION = TaskHead("regression")
NANOSECOND = 1e-9 / 60  # minutes
BUDGET = StopRule(5, max_minutes=1.0)  # at most 5 epochs or a minute


def recs(seconds: list[tuple[float, float]]) -> list[EpochRecord]:
    """Records of epochs that took (training, evaluation) seconds, validation worsening after epoch 0."""
    return [EpochRecord(e, 0.0, 1, 0, t, eval_seconds=v, val={"rmse": 1.0 + e}) for e, (t, v) in enumerate(seconds)]


def test_the_budget_counts_training_and_evaluation_of_every_epoch_run():
    r = recs([(20.0, 10.0), (20.0, 10.0), (20.0, 10.0)])
    assert not out_of_time(r[:1], 1.0)  # 30 s of a minute
    assert out_of_time(r[:2], 1.0)  # 60 s: the budget is spent
    assert not out_of_time(r, 0.0)  # 0 = no budget
    assert [finished(r[: e + 1], REGRESSION, BUDGET, e + 1) for e in range(3)] == [False, True, True]
    s = stopping(r[:2], REGRESSION, BUDGET)
    assert s["epochs_run"] == 2 and s["max_minutes"] == 1.0
    assert s["reason"] == "max-minutes 1 reached: 2 epochs took 1.0 minutes of training and evaluation"
    assert s["stopped_early"] is False  # the patience did not stop it
    assert "max-minutes" not in stopping(r[:1], REGRESSION, BUDGET)["reason"]


def test_a_budget_under_zero_is_refused_by_name():
    with pytest.raises(ConfigError, match="run-config 'max-minutes' must be >= 0"):
        RunConfig.from_flower({"dataset": "hdb", "max-minutes": -1.0})
    assert RunConfig.from_flower({"max-minutes": 30.0}).train.max_minutes == 30.0


def test_a_vfl_run_stops_after_the_epoch_that_spent_its_budget(tmp_path):
    cfg = RunConfig.of(
        dataset="hdb", n_rows=600, k=5, batch_size=64, epochs=4, max_minutes=NANOSECOND, out_dir=str(tmp_path)
    )
    s = modes.run_experiment(cfg, tmp_path / "run")
    assert s["epochs_run"] == 1 and s["best_epoch"] == 0
    assert s["stopping"]["reason"].startswith("max-minutes ") and s["stopping"]["max_epochs"] == 4


def test_entity_augmentation_stops_on_its_budget_too(tmp_path):
    cfg = RunConfig.of(
        dataset="digits", n_rows=300, mode="entity-aug", epochs=4, max_minutes=NANOSECOND, out_dir=str(tmp_path)
    )
    s = modes.run_experiment(cfg, tmp_path / "run")
    assert s["epochs_run"] == 1 and s["stopping"]["reason"].startswith("max-minutes ")
