"""The yardstick `fedsim train` prints beside a run (fedsim/yardstick.py): boosting's iteration
and the pooled K are chosen on validation rows only; a planted test set that would change the
choice if it were read does not; the verdict calls a gap only beyond the test rows' noise."""

import json
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from datasets.base import Split
from fedsim import yardstick as ys
from strategies.heads import TaskHead


@dataclass
class Tiny:
    task: str
    labels: np.ndarray
    split: Split
    n_classes: int = 1
    primary: object = None


def _planted(n=600, seed=0):
    """Regression: y = x0 on every row. Two candidate pooled tables: 'val' carries y on the
    validation rows (noise on test), 'test' carries y on the test rows (noise on validation)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 1))
    y = (x[:, 0] * 0.1).astype(np.float64)  # the primary's feature: a weak signal
    y = y + rng.normal(size=n)
    idx = rng.permutation(n)
    split = Split(np.sort(idx[:400]), np.sort(idx[400:500]), np.sort(idx[500:]))
    for_val, for_test = rng.normal(size=(n, 1)), rng.normal(size=(n, 1))
    for_val[split.train, 0] = for_val[split.val, 0] = 0.0
    for_test[split.train, 0] = for_test[split.val, 0] = 0.0
    both = np.concatenate([split.train, split.val])
    for_val[both, 0] = y[both]  # informative on train and validation, noise on test
    for_test[split.train, 0] = y[split.train]
    for_test[split.test, 0] = y[split.test]  # informative on train and test, noise on validation
    return Tiny("regression", y, split, primary=SimpleNamespace(features=x)), for_val, for_test


def test_the_pooled_k_is_chosen_on_validation_even_where_test_rows_would_choose_otherwise(monkeypatch):
    ds, for_val, for_test = _planted()
    monkeypatch.setattr(ys, "neighbour_means", lambda ds, cfg: {1: for_val, 5: for_test})
    cfg = SimpleNamespace(train=SimpleNamespace(seed=0, mode="vfl"))
    head = TaskHead.fit("regression", ds.labels[ds.split.train], 1)
    chosen = ys.pooled(ds, cfg, head)
    assert chosen["joined"] == "top-1 mean"  # validation's choice
    by_test = {
        k: ys.score(ds, head, np.hstack([ds.primary.features, m]), 0)["test"] for k, m in ((1, for_val), (5, for_test))
    }
    assert by_test[5] < by_test[1]  # the planted test set would have chosen K = 5, had it been read


def test_changing_the_test_labels_changes_no_choice_and_no_validation_number():
    ds, for_val, _ = _planted()
    head = TaskHead.fit("regression", ds.labels[ds.split.train], 1)
    x = np.hstack([ds.primary.features, for_val])
    a = ys.score(ds, head, x, 0)
    flipped = ds.labels.copy()
    flipped[ds.split.test] = -flipped[ds.split.test]  # a test set that prefers the first iterations
    b = ys.score(Tiny("regression", flipped, ds.split, primary=ds.primary), head, x, 0)
    assert (a["val"], a["iterations"]) == (b["val"], b["iterations"]) and a["test"] != b["test"]


def test_the_verdict_calls_a_gap_only_beyond_the_test_rows_noise():
    head = TaskHead.fit("regression", np.array([0.0, 1.0]), 1)
    alone = {"test": 10.0, "error": 1.0}  # noise of a difference: 2 x sqrt(2) x 1 = 2.83
    assert ys.verdict(head, 6.0, alone).startswith("federating helps")  # RMSE: lower is better
    assert ys.verdict(head, 8.0, alone).startswith("level")
    assert ys.verdict(head, 13.0, alone).startswith("federating does not pay")
    acc = TaskHead.fit("binary", np.array([0, 1]), 2)
    assert ys.verdict(acc, 0.9, {"test": 0.8, "error": 0.01}).startswith("federating helps")  # accuracy: higher


def test_the_verdict_states_its_margin_to_the_gaps_precision():
    """A gap just beyond its margin must not read as smaller than the margin it was compared with
    (a fresh-clone walk printed "30.84 worse ... (more than 31, ...)" for a margin of 30.73)."""
    head = TaskHead.fit("regression", np.array([0.0, 1.0]), 1)
    alone = {"test": 100.0, "error": 10.864}  # margin 2 sqrt(2) x 10.864 = 30.728
    said = ys.verdict(head, 130.84, alone)
    assert said.startswith("federating does not pay") and "more than 30.73" in said, said
    said = ys.verdict(head, 69.16, alone)
    assert said.startswith("federating helps") and "more than 30.73" in said, said
    assert "within 30.73" in ys.verdict(head, 110.0, alone)


def test_the_sampling_error_shrinks_with_more_test_rows():
    head = TaskHead.fit("regression", np.array([0.0, 1.0]), 1)
    rng = np.random.default_rng(0)
    small, large = (ys.sampling_error(head, rng.normal(size=n), np.zeros(n), 0) for n in (100, 10_000))
    # the standard error of an RMSE falls as 1 / sqrt(rows): 10x fewer at 100x the rows, within 2x
    assert 5 < small / large < 20


def test_a_primary_without_features_is_measured_against_the_constant():
    y = np.array([0, 1, 1, 1, 0, 1, 1, 1], dtype=np.int64)
    split = Split(np.arange(4), np.array([4]), np.arange(5, 8))
    ds = Tiny("binary", y, split, n_classes=2)
    head = TaskHead.fit("binary", y[split.train], 2)
    out = ys.constant(ds, head)
    assert out["model"] == "constant" and out["test"] == pytest.approx(
        1.0
    )  # P(y=1) = 0.75 on train: every test row called 1


def test_a_yardstick_that_cannot_be_computed_warns_and_keeps_the_runs_exit_status(tmp_path, monkeypatch, capsys):
    """The run finished: a yardstick that fails (here: its data cannot be read) says why on stderr,
    writes no yardstick.json, and the exit status stays 0."""
    import argparse

    from fedsim import train

    def unreadable(cfg, run_dir, why, neural):
        raise FileNotFoundError("the guests' files are on their own hosts")

    monkeypatch.setattr(ys, "measure", unreadable)
    cfg = SimpleNamespace(
        link=SimpleNamespace(linkage_dir=""),
        train=SimpleNamespace(mode="entity-aug"),
        data=SimpleNamespace(dataset="csv"),
    )
    assert train.yardstick(cfg, tmp_path, argparse.Namespace(deployment=None), {}) == 0
    err = capsys.readouterr().err
    assert "yardstick was not computed: FileNotFoundError: the guests' files" in err
    assert not (tmp_path / "yardstick.json").exists()


def test_own_data_gets_its_neural_model_alone_on_the_same_split_and_leaves_no_run_of_it_behind(tmp_path, capsys):
    from fedsim.cli import main
    from tests.test_byo import write_parties

    write_parties(tmp_path)
    argv = ["train", "--dataset", "csv", "--data-dir", str(tmp_path), "--out-dir", str(tmp_path / "runs")]
    argv += ["--run-name", "r", "--recipe", "given", "--engine", "inprocess", "--epochs", "2", "-c", "k=4"]
    assert main(argv) == 0
    y = json.loads((tmp_path / "runs" / "r" / "yardstick.json").read_text())
    neural = y["primary_alone_neural"]
    assert neural["model"] == "neural (method solo)" and neural["test"] > 0 and neural["val"] > 0
    assert "primary alone, neural" in capsys.readouterr().out
    assert not (tmp_path / "runs" / "r" / "yardstick-solo").exists()


def test_the_yardstick_boosts_on_a_bounded_thread_count_and_writes_only_under_the_run(tmp_path, monkeypatch):
    """Its boosting ran on every core of a loaded machine and printed nothing for minutes: now on
    one thread unless the run asked for more (run-config threads), and its only file is the run's
    yardstick.json (the neural primary-alone's run folder is removed)."""
    import contextlib

    import threadpoolctl

    from fedsim.cli import main
    from tests.test_byo import write_parties

    caps, seen, real_limits, real_score = [], [], threadpoolctl.threadpool_limits, ys.score

    @contextlib.contextmanager
    def watched(limits=None, user_api=None):  # the cap the yardstick sets, and whether boosting runs under it
        with real_limits(limits=limits, user_api=user_api):
            caps.append(limits)
            yield
            caps.pop()

    monkeypatch.setattr(threadpoolctl, "threadpool_limits", watched)
    monkeypatch.setattr(ys, "score", lambda *a, **k: seen.append(list(caps)) or real_score(*a, **k))
    write_parties(tmp_path)

    def train(name: str, *extra: str) -> int:
        argv = ["train", "--dataset", "csv", "--data-dir", str(tmp_path), "--out-dir", str(tmp_path / "runs")]
        argv += ["--run-name", name, "--recipe", "given", "--engine", "inprocess", "--epochs", "1", "-c", "k=4"]
        return main([*argv, *extra])

    assert train("r", "--no-yardstick") == 0 and not (tmp_path / "runs" / "r" / "yardstick.json").exists()
    before = set(tmp_path.rglob("*"))
    assert train("s") == 0  # the same run, with its yardstick
    assert seen and all(cap == [1] for cap in seen), seen  # boosting alone and pooled: under a cap of one thread
    outside = sorted(str(p) for p in set(tmp_path.rglob("*")) - before if not p.is_relative_to(tmp_path / "runs" / "s"))
    assert not outside, outside
    assert (tmp_path / "runs" / "s" / "yardstick.json").exists()


def test_a_run_ahead_of_the_pooled_reference_is_told_why_that_is_no_error():
    """The fresh-clone walk read a pooled reference of 107 beside a run's 67.8 RMSE as a fault:
    the printed yardstick now says the reference is no ceiling, only where the run is ahead by
    more than the reference's own error, in the metric's direction."""

    def shown(metric: str, federated: float, pooled: float, error: float = 2.0) -> bool:
        y = {"metric": metric, "test_rows": 100, "federated": federated, "verdict": "-"}
        y |= {"primary_alone": {"test": 1.0, "error": 0.1, "model": "boosting"}}
        y |= {"pooled": {"test": pooled, "error": error, "joined": "K = 5"}}
        return ys.POOLED_NOT_A_CEILING in ys.lines(y)

    assert shown("rmse", 67.8, 107.0) and not shown("rmse", 106.0, 107.0) and not shown("rmse", 110.0, 107.0)
    assert shown("accuracy", 0.95, 0.90, 0.01) and not shown("accuracy", 0.905, 0.90, 0.01)
    assert not shown("accuracy", 0.85, 0.90, 0.01)
