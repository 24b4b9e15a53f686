"""One rule decides the recipe everywhere: a built-in data set's defaults are the reference code's
settings (K, batch, epochs, rate, decay, model), and its recipe (input encoding, method, the
attention's start) is chosen by `fedsim train`'s search on the run's own rows, as on own data.
The recipes this project chose by hand on each built-in set's validation are a named option,
``hparams = "dataset"``, which is also how every run kept before the change reads back."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from app.config import RunConfig
from app.vfl.checkpoint import resolved
from fedsim import search_step
from fedsim.cli import main as fedsim

HAND_CHOSEN = {  # docs/fedsim-attn.md: each chosen on that data set's validation
    "hdb": ("ple", "top1", 1.0),
    "house": ("ple", "silent", 0.3),
    "game": ("ple", "silent", 1.0),
    "frog": ("ple", "top1", 1.0),
}


def _recipe(cfg: RunConfig) -> tuple[str, str, float]:
    model = cfg.resolve().model
    return cfg.data.scale, model.attention_start, model.attention_lr


@pytest.mark.parametrize("dataset", [*HAND_CHOSEN, "synthetic", "house3"])
def test_a_built_in_data_set_gets_no_hand_chosen_recipe_by_default(dataset):
    cfg = RunConfig.from_flower({"dataset": dataset})
    assert cfg.train.hparams == "reference"
    assert _recipe(cfg) == ("standard", "top1", 1.0)
    rows = cfg.hyperparameters()
    for name in ("input_scale", "attention_start"):
        assert "chosen on validation" not in rows[name]["source"], (name, rows[name])


@pytest.mark.parametrize("dataset", HAND_CHOSEN)
def test_hparams_dataset_is_the_recipe_chosen_by_hand_and_says_so(dataset):
    cfg = RunConfig.from_flower({"dataset": dataset, "hparams": "dataset"})
    assert _recipe(cfg) == HAND_CHOSEN[dataset]
    assert cfg.hyperparameters()["input_scale"]["source"].startswith('hparams "dataset"')
    given = RunConfig.from_flower({"dataset": dataset, "hparams": "dataset", "input-scale": "quantile"})
    assert given.data.scale == "quantile" and given.hyperparameters()["input_scale"]["source"] == "run config"


def test_a_run_kept_before_reads_back_with_the_recipe_it_trained_with():
    """Runs written before the change recorded ``hparams = "dataset"`` and an empty input-scale,
    which then meant the hand-chosen one: predict and resume must read them as trained."""
    old = {"dataset": "house", "hparams": "dataset", "input_scale": "", "attention_start": "", "attention_lr": 0.0}
    assert _recipe(RunConfig.of(**old)) == HAND_CHOSEN["house"]
    assert resolved(old) | {"input_scale": "ple"} == resolved(old)
    assert resolved({**old, "hparams": "reference"})["input_scale"] == "standard"


def _why_not(**flat) -> str:
    cfg = RunConfig.from_flower(flat)
    args = argparse.Namespace(recipe="search", deployment=False)
    return search_step.why_not(cfg, args)


def test_fedsim_train_searches_a_built_in_data_set_unless_the_hand_chosen_recipe_is_asked_for():
    assert _why_not(dataset="hdb") == ""
    assert _why_not(dataset="synthetic") == ""
    assert "hparams" in _why_not(dataset="hdb", hparams="dataset")
    assert "Entity Augmentation" in _why_not(dataset="credit", mode="entity-aug")
    # a service's linkage (linkage-dir): the primary reads only its own file, wherever the others' are
    said = _why_not(dataset="hdb", **{"linkage-dir": "/srv/linkage"})
    assert "only its own file" in said and "hosts" not in said


def test_fedsim_train_on_a_built_in_data_set_runs_the_search_and_records_it(tmp_path, capsys):
    out = tmp_path / "runs"
    argv = ["train", "--dataset", "synthetic", "--out-dir", str(out), "--run-name", "s", "-c", "n-rows=300"]
    argv += ["--epochs", "2", "-c", "k=4", "-c", "batch-size=32", "--engine", "inprocess", "--no-yardstick"]
    assert fedsim(argv) == 0
    said = capsys.readouterr().out
    assert "recipe search: 3 candidate(s) (attn, fedsim, attn-ple)" in said
    assert (
        "4 runs, each candidate at most 1 epoch(s), two thirds of the run's (budget 4; --budget 6 adds" in said
    )  # 2 * 2 // 3
    record = json.loads((out / "s" / "search.json").read_text())
    assert record["chosen"] in ("attn", "fedsim", "attn-ple")
    run = json.loads((out / "s" / "config.json").read_text())["run"]
    assert run["method"] == record["chosen_values"]["method"]


def _recording_trainer(seen: list[dict]):
    """A search trainer that keeps each candidate's run-config values and writes planted curves."""
    from tests.test_recipe_search import _rows

    def train(values: dict, run_dir: Path) -> None:
        seen.append(values)
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in _rows([3.0, 2.0], [3.0, 2.0])))
        (run_dir / "summary.json").write_text(json.dumps({"stopping": {"selected_on": "rmse"}}))

    return train


def test_every_candidate_stops_early_as_on_own_data_unless_the_user_set_a_patience(tmp_path):
    """A built-in set trains fixed epochs; its candidates stop when validation does (patience 10,
    app/config.py UNTUNED_PATIENCE), so the search costs on it what it costs on own data."""
    from app.config import UNTUNED_PATIENCE

    seen: list[dict] = []

    train = _recording_trainer(seen)
    search_step.run({"dataset": "house"}, tmp_path / "r", 4, True, train)
    assert [v["patience"] for v in seen] == [UNTUNED_PATIENCE] * 3
    seen.clear()
    search_step.run({"dataset": "house", "patience": 0}, tmp_path / "q", 4, True, train)
    assert [v["patience"] for v in seen] == [0] * 3


def test_a_fixed_epoch_runs_candidates_train_two_thirds_of_its_epochs_so_the_search_stays_under_3x(tmp_path):
    """Three candidates on 6/7 of the run's training rows at two thirds of its epochs, and the run:
    3 x 6/7 x 2/3 + 1 = 2.7 runs at most. A run that stops early (own data) caps nothing."""
    seen: list[dict] = []

    train = _recording_trainer(seen)
    for values, epochs in (({"dataset": "house"}, 66), ({"dataset": "house", "epochs": 40}, 26)):
        seen.clear()
        done = search_step.run(values, tmp_path / str(epochs), 4, True, train)
        assert [v["epochs"] for v in seen] == [epochs] * 3
        assert done.record["candidate_epochs"] == epochs
        assert "epochs" not in done.values or done.values["epochs"] == values.get("epochs")  # the run keeps its own
    seen.clear()
    search_step.run({"dataset": "house", "patience": 5}, tmp_path / "stops", 4, True, train)
    assert all("epochs" not in v for v in seen)  # it stops early: no cap
