"""One command trains a run folder at a time: a second `fedsim train` under the run name another is
training refused, naming the holder, once its input is checked and before it writes anything. Two
such commands once left config.json and metrics.jsonl of one run beside summary.json and kept/ of
the other, both exit 0."""

from __future__ import annotations

import os

from fedsim.cli import main as fedsim
from files.run_lock import hold_run
from tests.test_byo import write_parties


def test_a_second_train_of_a_run_being_trained_is_refused_naming_the_holder(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    write_parties(tmp_path / "data")
    out = tmp_path / "runs"
    argv = ["train", "--dataset", "csv", "--data-dir", str(tmp_path / "data"), "--out-dir", str(out)]
    argv += ["--engine", "inprocess", "--recipe", "given", "--no-yardstick", "--epochs", "1", "--run-name", "r"]
    with hold_run(out / "r"):  # as the first command holds it while it trains
        assert fedsim(argv) == 2
        err = capsys.readouterr().err
        assert f"run r in {out} is being trained by another command (pid {os.getpid()})" in err, err
        assert [p.name for p in (out / "r").iterdir()] == [".lock"]  # refused before it wrote anything
    assert fedsim([*argv[:-1], "r"]) == 0  # once it lets go, the run trains
    assert (out / "r" / "summary.json").exists()
    with hold_run(out / "other"):  # another run's command does not stand in the way
        assert fedsim([*argv[:-1], "r"]) == 0
