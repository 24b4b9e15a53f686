"""One run record for every engine and both modes (app/run_record.py): the same files, the same
summary schema with one type for ``seconds``, and a sweep that reads the record as written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app import modes
from app.config import MODES, RunConfig
from app.run_files import WRITTEN
from app.run_record import read_metrics, read_summary
from app.vfl import server as primary

TINY = dict(dataset="synthetic", n_rows=300, epochs=2, batch_size=64)
EA_TINY = dict(dataset="synthetic", n_rows=300, mode="entity-aug", epochs=2, batch_size=32)
CORE = {
    "dataset",
    "mode",
    "method",
    "seed",
    "engine",
    "device",
    "machine",
    "best_epoch",
    "val",
    "test",
    "epochs_run",
    "steps",
    "seconds",
    "exchange",
    "preprocessing",
    "stopping",
    "hyperparameters",
    "constant_predictor",
    "warnings",
}
SECONDS = {"total", "load", "linkage", "train_and_eval", "epochs"}


def _flower_solo(tmp: Path) -> Path:  # the ServerApp's run; Solo has no secondaries, so no Grid is needed
    primary.run_primary(None, RunConfig.of(**TINY, method="solo", out_dir=str(tmp), run_name="flower-solo"))
    return tmp / "flower-solo"


def _in_process(values: dict, name: str):
    def run(tmp: Path) -> Path:
        modes.run_experiment(RunConfig.of(**values, out_dir=str(tmp / "linkage")), tmp / name)
        return tmp / name

    return run


RUNS = {  # (engine, mode, method) -> run it, return its folder
    ("flower", "vfl", "solo"): _flower_solo,
    ("inprocess", "vfl", "fedsim"): _in_process(dict(TINY, method="fedsim"), "fedsim"),
    ("inprocess", "vfl", "solo"): _in_process(dict(TINY, method="solo"), "solo"),
    ("inprocess", "entity-aug", "entity-aug"): _in_process(EA_TINY, "ea"),
}


@pytest.mark.parametrize("key", sorted(RUNS), ids="-".join)
def test_every_engine_and_mode_writes_one_record(key, tmp_path):
    folder = RUNS[key](tmp_path)
    summary = read_summary(folder)
    assert CORE <= set(summary), f"missing {CORE - set(summary)}"
    assert (summary["engine"], summary["mode"], summary["method"]) == key
    seconds = summary["seconds"]
    assert set(seconds) == SECONDS and all(isinstance(seconds[k], float) for k in SECONDS - {"epochs"})
    assert len(seconds["epochs"]) == summary["epochs_run"] and seconds["total"] >= seconds["train_and_eval"] > 0
    assert all((folder / name).exists() for name in WRITTEN)
    assert len(read_metrics(folder)) == summary["epochs_run"] == 2
    assert np.load(folder / "step_losses.npy").shape == (summary["steps"],)
    config = json.loads((folder / "config.json").read_text())
    assert config["run"]["mode"] == key[1] and "resolved" in config
    best = read_metrics(folder)[summary["best_epoch"]]
    assert best["val"] == summary["val"] and best["test"] == summary["test"]
    assert summary["stopping"] == {
        "patience": 0 if key[1] == "vfl" else 10,
        "max_epochs": 2,
        "max_minutes": 0.0,
        "epochs_run": 2,
        "stopped_early": False,
        "reason": summary["stopping"]["reason"],
        # the key metric with fixed epochs; a classifier that stops early: its log loss
        "selected_on": "accuracy" if key[1] == "vfl" else "log_loss",
    }
    assert summary["hyperparameters"]["epochs"] == {"value": 2, "source": "run config"}
    assert config["hyperparameters"] == summary["hyperparameters"]
    progress = json.loads((folder / "progress.json").read_text())
    assert (progress["phase"], progress["epoch"], progress["best_epoch"]) == ("done", 1, summary["best_epoch"])


def test_the_sweep_keeps_the_record_as_the_engine_wrote_it(tmp_path, monkeypatch):
    """Before: the sweep runner rewrote summary.json after the run (adding the machine)."""
    from experiments import sweep

    written = {}
    engine = modes.run_experiment

    def recording_engine(cfg, out):
        summary = engine(cfg, out)
        written["bytes"] = (Path(out) / "summary.json").read_bytes()
        return summary

    monkeypatch.setattr(modes, "run_experiment", recording_engine)
    out = tmp_path / "synthetic" / "solo" / "s0"
    sweep.run_one({**{k.replace("_", "-"): v for k, v in TINY.items()}, "method": "solo", "seed": 0}, out, "inprocess")
    assert (out / "summary.json").read_bytes() == written["bytes"]
    assert read_summary(out)["machine"]


def test_a_record_from_before_the_schema_reads_with_seconds_as_a_dict(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"seconds": 12.5, "test": {"rmse": 1.0}}))
    assert read_summary(tmp_path)["seconds"] == {
        "total": 12.5,
        "load": 0.0,
        "linkage": 0.0,
        "train_and_eval": 0.0,
        "epochs": [],
    }


def test_one_dispatch_covers_every_mode():
    assert set(modes.SERVER_RUNS) == set(modes.IN_PROCESS_RUNS) == set(MODES)


def test_the_sweep_shows_runs_done_of_all_with_an_eta_on_a_terminal_only(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from experiments import sweep

    def fake_runs(pending, engine, workers=None):
        for name, _, _ in pending:
            yield name, {"test": {"rmse": 1.0}, "best_epoch": 0, "epochs_run": 1}

    monkeypatch.setattr(sweep, "run_pending", fake_runs)
    pending = [(f"run {i}", {}, tmp_path) for i in range(2)]
    screen = io.StringIO()
    logged = []
    sweep.run_all(
        pending,
        "inprocess",
        logged.append,
        already=3,
        console=Console(file=screen, force_terminal=True, color_system=None, width=100),
    )
    assert "5/5 runs" in screen.getvalue() and "ETA" in screen.getvalue()
    assert logged == [
        "run 0: test rmse 1.0000 (best epoch 0, 1 epochs run)",
        "run 1: test rmse 1.0000 (best epoch 0, 1 epochs run)",
    ]
    quiet = io.StringIO()  # stderr to a file or a pipe: no bar
    sweep.run_all(pending, "inprocess", logged.append, console=Console(file=quiet, force_terminal=False))
    assert quiet.getvalue() == ""


def test_the_hyperparameters_are_listed_once_per_source():
    """A run on own data said "fallback: hdb's defaults — dataset has no tuned defaults" on 11 lines."""
    from app.run_record import hyperparameter_lines

    hyper = {
        "k": {"value": 50, "source": "fallback: hdb's defaults"},
        "epochs": {"value": 2, "source": "run config"},
        "lr": {"value": 0.001, "source": "fallback: hdb's defaults"},
    }
    assert hyperparameter_lines(hyper) == ["  fallback: hdb's defaults: k = 50, lr = 0.001", "  run config: epochs = 2"]
