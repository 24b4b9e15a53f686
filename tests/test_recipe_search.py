"""The recipe search of `fedsim train` on own parties (fedsim/recipe_search.py, fedsim/search_step.py):
search runs that never see the test rows, a score no half reads at the epoch it chose itself,
the budget's plan, and a run trained with the choice that predicts == its evaluation, whatever
the search can choose."""

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


@pytest.mark.parametrize("n", [30, 400, 1001])
def test_a_search_split_holds_out_a_tenth_of_the_training_rows_and_leaves_the_test_rows_out(n):
    usual = split_primary(n, seed=3)
    assert np.array_equal(split_primary(n, seed=3, fold=0).train, usual.train)  # fold 0 is the usual split
    s = split_primary(n, seed=3, fold=1)
    np.testing.assert_array_equal(s.val, usual.val)  # the usual validation rows choose the epoch
    assert set(s.test) <= set(usual.train) and len(s.test) == len(usual.val)  # a tenth of training held out
    assert set(s.train) == set(usual.train) - set(s.test)
    assert not set(usual.test) & (set(s.train) | set(s.val) | set(s.test))  # the real test rows: no part
    assert not set(split_primary(n, seed=3, fold=2).test) & set(s.test)
    with pytest.raises(DatasetError, match="search-fold must be in"):
        split_primary(n, seed=3, fold=n)


def test_the_budget_affords_candidates_in_order_beside_the_run_and_keys_the_user_set_stay_set():
    p = rs.plan({}, rs.DEFAULT_BUDGET)
    assert [c.name for c in p.candidates] == ["attn", "fedsim", "attn-ple"] and p.members == 0 and p.runs == 4
    assert len(rs.plan({}, 100).candidates) == len(rs.CANDIDATES) == 6
    # beyond the default, members of the chosen recipe first (an ensemble of at most 3), then candidates:
    # the attention's start (silent: the model starts as the paper's FedSim) at the end
    assert [(len(rs.plan({}, b).candidates), rs.plan({}, b).members) for b in (3, 5, 6, 7, 9, 100)] == [
        (2, 0),
        (3, 1),
        (3, 2),
        (4, 2),
        (6, 2),
        (6, 2),
    ]
    assert all(rs.plan({}, b).runs == b for b in range(3, 10))  # every run the budget names, no more
    assert [c.name for c in rs.plan({}, 9).candidates][4:] == ["attn-silent", "attn-ple-silent"]
    assert rs.plan({}, 8).candidates[-1].values == {"method": "fedsim_attn", "attention-start": "silent"}
    held = rs.plan({"attention-start": "silent"}, 100)  # the user's start: fedsim_attn's candidates are silent
    assert [c.name for c in held.candidates] == ["attn-silent", "fedsim", "attn-ple-silent", "fedsim-ple"]
    assert held.candidates[0].values == {"method": "fedsim_attn", "attention-start": "silent"}
    assert rs.plan({}, 2) is None and rs.plan({}, 1) is None  # no choice, and no ensemble before a search
    fixed = rs.plan({"method": "fedsim"}, 100)
    assert [c.values for c in fixed.candidates] == [{"method": "fedsim"}, {"method": "fedsim", "input-scale": "ple"}]
    # named and described for what they train, not for the candidate they were before the user's keys
    assert [c.name for c in fixed.candidates] == ["fedsim", "fedsim-ple"]
    assert all("the paper's FedSim" in c.why for c in fixed.candidates)
    assert rs.plan({"method": "fedsim"}, rs.DEFAULT_BUDGET).members == 1  # two candidates leave a run for a member
    one = rs.plan({"method": "fedsim", "input-scale": "ple"}, rs.DEFAULT_BUDGET)  # one recipe: members only
    assert one.candidates == () and one.members == 2 and one.runs == 3
    assert rs.plan({"method": "fedsim", "input-scale": "ple"}, 1) is None
    assert "an ensemble of up to 3" in rs.plan({}, 6).text(True) and "--budget" not in rs.plan({}, 6).text(True)
    assert "budget 4; --budget 6 adds 2 members" in p.text(True)  # the default says how to buy an ensemble


def _rows(val: list[float], test: list[float]) -> list[dict]:
    return [{"epoch": e, "val": {"rmse": v}, "test": {"rmse": t}} for e, (v, t) in enumerate(zip(val, test))]


def test_each_held_out_tenth_is_read_at_the_epoch_the_other_chose():
    # A prefers epoch 2 (B reads 9 there); B prefers epoch 0 (A reads 7 there): (9 + 7) / 2
    assert rs.cross_score(_rows([7.0, 6.0, 5.0], [4.0, 8.0, 9.0]), "rmse") == ("rmse", 8.0, {"A": 2, "B": 0})
    acc = [
        {"epoch": e, "val": {"accuracy": v}, "test": {"accuracy": t}}
        for e, (v, t) in enumerate([(0.5, 0.9), (0.8, 0.6)])
    ]
    assert rs.cross_score(acc, "accuracy") == ("accuracy", (0.6 + 0.5) / 2, {"A": 1, "B": 0})
    # a classifier that stops early selects on its log loss (lower is better), and so does its score
    ll = [
        {"epoch": e, "val": {"accuracy": 0.5, "log_loss": v}, "test": {"log_loss": t}}
        for e, (v, t) in enumerate([(0.5, 0.4), (0.3, 0.6)])
    ]
    assert rs.cross_score(ll, "log_loss") == ("log_loss", (0.6 + 0.5) / 2, {"A": 1, "B": 0})


def _fake_trainer(curves: dict, calls: list):
    """Writes a search run's metrics.jsonl from planted (A, B) curves per candidate, and records
    the split each run would train on."""

    def train(values: dict, run_dir: Path) -> None:
        name = next(c.name for c in rs.CANDIDATES if values["run-name"].endswith(f"-{c.name}"))
        calls.append((name, values["search-fold"]))
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in _rows(*curves[name])))
        (run_dir / "config.json").write_text("{}")
        (run_dir / "summary.json").write_text(json.dumps({"stopping": {"selected_on": "rmse"}}))

    return train


def test_a_wobbling_candidate_gains_nothing_from_its_lucky_epoch(tmp_path):
    """fedsim's best validation value (3) is a lucky epoch its other half does not share: read at
    the epoch the other half chose it scores 9; attn's steadier curve wins."""
    curves = {
        "attn": ([6.0, 5.0, 5.0], [6.0, 5.0, 5.0]),
        "fedsim": ([9.0, 3.0, 9.0], [2.0, 9.0, 9.0]),
        "attn-ple": ([8.0, 8.0, 8.0], [8.0, 8.0, 8.0]),
    }
    calls: list = []
    done = search_step.run({"dataset": "csv"}, tmp_path / "r", 4, True, _fake_trainer(curves, calls))
    assert calls == [("attn", 1), ("fedsim", 1), ("attn-ple", 1)]  # every candidate on the search split
    assert done.record["chosen"] == "attn" and done.values["method"] == "fedsim_attn"
    assert min(curves, key=lambda c: min(curves[c][0])) == "fedsim"  # the best-value rule would have chosen it
    assert [c["score"] for c in done.record["candidates"]] == [5.0, 9.0, 8.0]
    (tmp_path / "r").mkdir()  # as the run, trained with the choice, leaves it
    (tmp_path / "r" / "config.json").write_text('{"hyperparameters": {}}')
    search_step.write(tmp_path / "r", done, {})
    assert sorted(p.name for p in (tmp_path / "r" / "search").iterdir()) == [
        "r.search-attn",
        "r.search-attn-ple",
        "r.search-fedsim",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # the candidates' folders are gone


def test_a_failed_candidate_is_recorded_and_a_search_where_all_fail_fails_by_name(tmp_path):
    def broken(values, run_dir):
        raise ValueError(f"planted failure of {values['run-name']}")

    with pytest.raises(RuntimeError, match="every candidate of the recipe search failed.*planted failure"):
        search_step.run({}, tmp_path / "r", 4, True, broken)
    assert not (tmp_path / "r").exists()
    outcomes = [rs.Outcome(rs.CANDIDATES[0], "rmse", failed="x"), rs.Outcome(rs.CANDIDATES[1], "rmse", 5.0)]
    assert math.isnan(outcomes[0].score) and rs.choose(outcomes).candidate.name == "fedsim"


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


def test_fedsim_train_searches_by_default_without_the_test_rows_and_its_run_predicts_its_evaluation(tmp_path, capsys):
    write_parties(tmp_path)
    out = tmp_path / "runs"
    argv = ["train", "--dataset", "csv", "--data-dir", str(tmp_path), "--out-dir", str(out), "--run-name", "r", *TINY]
    assert fedsim(argv) == 0
    said = capsys.readouterr().out
    assert "recipe search: 3 candidate(s) (attn, fedsim, attn-ple), one run each" in said
    assert said.index("search [3/3]") < said.index("recipe search chose") < said.index("finished:")
    record = json.loads((out / "r" / "search.json").read_text())
    assert [c["name"] for c in record["candidates"]] == ["attn", "fedsim", "attn-ple"] and record["chosen"]
    test_rows = set(pd.read_csv(out / "r" / "split.csv").query("part == 'test'")["row"])
    for c in record["candidates"]:  # every search run left exactly the run's test rows unused
        split = pd.read_csv(out / "r" / "search" / f"r.search-{c['name']}" / "split.csv")
        assert set(split.query("part == 'unused'")["row"]) == test_rows
    run_config = json.loads((out / "r" / "config.json").read_text())["run"]
    assert run_config["search_fold"] == 0
    assert {"method": run_config["method"]} | (
        {"input-scale": "ple"} if run_config["input_scale"] == "ple" else {}
    ) == (record["chosen_values"])
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


def test_a_run_nobody_named_is_named_for_the_method_the_search_chose():
    from fedsim.train import renamed_for

    values = {"dataset": "csv", "mode": "vfl", "run-name": "csv-fedsim_attn-20261205-213000"}  # as run_values names it
    assert renamed_for(values, {**values, "method": "fedsim"})["run-name"] == "csv-fedsim-20261205-213000"
    named = {**values, "run-name": "mine"}
    assert renamed_for(named, {**named, "method": "fedsim"})["run-name"] == "mine"  # what the user named stays


def test_a_candidate_run_logs_errors_only_so_the_runs_own_warnings_are_said_once():
    """The candidates train on the run's own data: their warnings (blank cells filled, the last epoch
    the best) are the run's, which it prints at its end; a fresh-clone walk saw one five times."""
    import logging

    logger = logging.getLogger("flwr")
    before = logger.level
    with search_step._quiet():
        assert logger.isEnabledFor(logging.ERROR) and not logger.isEnabledFor(logging.WARNING)
    assert logger.level == before
