"""The recipe search of `fedsim train` on own parties (fedsim/recipe_search.py, fedsim/search_step.py):
folds that never move the test rows, a choice made on validation values alone, the budget's
plan, and a chosen run that is an ordinary run (predict == its evaluation, whatever is chosen)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from datasets import DatasetError, split_primary
from fedsim import recipe_search as rs
from fedsim import search_step
from fedsim.cli import main as fedsim
from tests.test_byo import write_parties


@pytest.mark.parametrize("n", [10, 400, 1001])
def test_a_validation_fold_moves_validation_within_the_non_test_rows_and_never_the_test_rows(n):
    usual = split_primary(n, seed=3)
    others = [split_primary(n, seed=3, fold=f) for f in range(1, 4)]
    assert np.array_equal(split_primary(n, seed=3, fold=0).val, usual.val)  # fold 0 is the usual split
    for s in others:
        np.testing.assert_array_equal(s.test, usual.test)
        assert len(s.val) == len(usual.val) and len(s.train) == len(usual.train)
        np.testing.assert_array_equal(
            np.sort(np.concatenate([s.train, s.val])), np.sort(np.concatenate([usual.train, usual.val]))
        )
        assert not set(s.val) & set(usual.val)  # another tenth validates
    assert not set(others[0].val) & set(others[1].val)
    with pytest.raises(DatasetError, match="val-fold must be in"):
        split_primary(n, seed=3, fold=n)


def test_the_budget_affords_candidates_in_order_and_keys_the_user_set_stay_set():
    p = rs.plan({}, rs.DEFAULT_BUDGET)
    assert [c.name for c in p.candidates] == ["attn", "fedsim"] and p.runs == 4 and p.finalists == 2
    assert rs.plan({}, 5).runs == 5 and len(rs.plan({}, 5).candidates) == 3  # 3 on fold 0, 2 on fold 1
    wide = rs.plan({}, 6)
    assert len(wide.candidates) == len(rs.CANDIDATES) == 4 and wide.finalists == 2 and wide.runs == 6
    assert rs.plan({}, 3) is None  # not two candidates on both folds: nothing to choose between
    fixed = rs.plan({"method": "fedsim"}, 100)
    assert [c.values for c in fixed.candidates] == [{"method": "fedsim"}, {"method": "fedsim", "input-scale": "ple"}]
    assert rs.plan({"method": "fedsim", "input-scale": "ple"}, 100) is None


def _fake_trainer(val: dict, test: dict, calls: list):
    """Writes an ordinary-looking run: its summary's validation value is ``val`` per candidate and
    fold, its test value ``test`` planted to favour another candidate."""

    def train(values: dict, run_dir: Path) -> dict:
        name = next(c.name for c in rs.CANDIDATES if values["run-name"].endswith(f"-{c.name}-f{values['val-fold']}"))
        calls.append((name, values["val-fold"]))
        run_dir.mkdir(parents=True)
        summary = {"val": {"rmse": val[name][values["val-fold"]]}, "test": {"rmse": test[name]}}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        (run_dir / "config.json").write_text(json.dumps({"run": {"run_name": values["run-name"]}}))
        return summary

    return train


def test_the_choice_reads_validation_folds_only_and_the_planted_test_rows_would_choose_otherwise(tmp_path):
    val = {"attn": [10.0, 12.0], "fedsim": [9.0, 14.0]}  # means 11.0 and 11.5
    test = {"attn": 50.0, "fedsim": 1.0}  # were test read, the second would win
    calls: list = []
    done = search_step.run({"dataset": "csv"}, tmp_path / "r", 4, True, _fake_trainer(val, test, calls))
    assert calls == [("attn", 0), ("fedsim", 0), ("attn", 1), ("fedsim", 1)]
    assert done.record["chosen"] == "attn" and done.values["method"] == "fedsim_attn" and done.trained
    assert json.loads((tmp_path / "r" / "config.json").read_text())["run"]["run_name"] == "r"
    # fold 0 on its own would have chosen the other: the second fold is what decided
    assert min(val, key=lambda c: val[c][0]) == "fedsim"
    kept = sorted(p.name for p in (tmp_path / "r" / "search").iterdir())
    assert kept == ["r.search-attn-f1", "r.search-fedsim-f0", "r.search-fedsim-f1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # the candidates' folders are gone


def test_only_the_better_half_on_the_first_fold_runs_on_the_second_and_only_they_can_be_chosen(tmp_path):
    val = {"attn": [30.0, 30.0], "fedsim": [20.0, 25.0], "attn-ple": [10.0, 40.0], "fedsim-ple": [5.0, 1.0]}
    test = {name: 0.0 for name in val}
    calls: list = []
    done = search_step.run({}, tmp_path / "r", 6, True, _fake_trainer(val, test, calls))
    assert calls[:4] == [("attn", 0), ("fedsim", 0), ("attn-ple", 0), ("fedsim-ple", 0)]
    assert calls[4:] == [("attn-ple", 1), ("fedsim-ple", 1)]  # the two best of fold 0, in the list's order
    assert done.record["chosen"] == "fedsim-ple"
    assert [c["name"] for c in done.record["candidates"] if len(c["val_by_fold"]) == 2] == ["attn-ple", "fedsim-ple"]


def test_a_failed_candidate_is_recorded_and_a_search_where_all_fail_fails_by_name(tmp_path):
    def broken(values, run_dir):
        raise ValueError(f"planted failure of {values['run-name']}")

    with pytest.raises(RuntimeError, match="every candidate of the recipe search failed.*planted failure"):
        search_step.run({}, tmp_path / "r", 4, True, broken)
    assert not (tmp_path / "r").exists()
    half = [
        rs.Outcome(rs.CANDIDATES[0], "rmse", {0: 1.0}, {1: "x"}),
        rs.Outcome(rs.CANDIDATES[1], "rmse", {0: 5.0, 1: 5.0}),
    ]
    assert math.isnan(half[0].score()) and rs.choose(half).candidate.name == "fedsim"


def _rmse_of_predicting_its_test_rows(folder: Path, run: Path) -> tuple[float, float]:
    split = pd.read_csv(run / "split.csv")
    sales = pd.read_csv(folder / "sales.csv")
    test = sales.iloc[split.loc[split.part == "test", "source_line"] - 2]
    test.drop(columns=["price"]).to_csv(folder / "new.csv", index=False)
    assert fedsim(["predict", str(run), str(folder / "new.csv"), "--out", str(folder / "p.csv")]) == 0
    pred = pd.read_csv(folder / "p.csv")["prediction"].to_numpy()
    rmse = float(np.sqrt(np.mean((pred - test["price"].to_numpy()) ** 2)))
    return rmse, json.loads((run / "summary.json").read_text())["test"]["rmse"]


TINY = ["--epochs", "2", "-c", "k=4", "-c", "batch-size=32", "--engine", "inprocess", "--no-yardstick"]


def test_fedsim_train_searches_by_default_and_its_chosen_run_predicts_its_own_evaluation(tmp_path, capsys):
    write_parties(tmp_path)
    out = tmp_path / "runs"
    argv = ["train", "--dataset", "csv", "--data-dir", str(tmp_path), "--out-dir", str(out), "--run-name", "r", *TINY]
    assert fedsim([*argv, "--budget", "6"]) == 0  # every candidate, ple inputs too
    hyper = json.loads((out / "r" / "config.json").read_text())["hyperparameters"]
    assert (
        hyper["input_scale"]["source"] == "recipe search (search.json)" or hyper["input_scale"]["value"] == "standard"
    )
    capsys.readouterr()
    assert fedsim(argv) == 0  # the default budget, over the finished run of that name
    said = capsys.readouterr().out
    assert "recipe search: 2 candidate(s) (attn, fedsim) on 2 validation folds: 4 runs" in said
    assert said.index("search [4/4]") < said.index("recipe search chose") < said.index("finished:")
    record = json.loads((out / "r" / "search.json").read_text())
    assert [len(c["val_by_fold"]) for c in record["candidates"]] == [2, 2]
    run_config = json.loads((out / "r" / "config.json").read_text())["run"]
    assert run_config["run_name"] == "r" and run_config["val_fold"] == 0
    assert run_config["method"] == {"attn": "fedsim_attn", "fedsim": "fedsim"}[record["chosen"]]
    got, evaluated = _rmse_of_predicting_its_test_rows(tmp_path, out / "r")
    assert got == pytest.approx(evaluated, rel=1e-4)
    capsys.readouterr()
    assert fedsim(["report", str(out / "r")]) == 0
    assert "<- chosen" in capsys.readouterr().out


@pytest.mark.parametrize("candidate", rs.CANDIDATES, ids=lambda c: c.name)
def test_every_recipe_the_search_can_choose_predicts_its_own_evaluation(candidate, tmp_path):
    write_parties(tmp_path)
    given = [x for k, v in candidate.values.items() if k != "method" for x in ("-c", f"{k}={v}")]
    argv = ["train", "--dataset", "csv", "--data-dir", str(tmp_path), "--out-dir", str(tmp_path / "runs")]
    argv += ["--run-name", "r", "--recipe", "given", "--method", candidate.values["method"], *given, *TINY]
    assert fedsim(argv) == 0
    got, evaluated = _rmse_of_predicting_its_test_rows(tmp_path, tmp_path / "runs" / "r")
    assert got == pytest.approx(evaluated, rel=1e-4)
