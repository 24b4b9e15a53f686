"""The one place that dispatches on run-config ``mode``: which run each training mode plays in
the ServerApp (over Flower) and in one process (the sweeps' engine)."""

from __future__ import annotations

from pathlib import Path

from flwr.serverapp import Grid

from app.config import ConfigError, RunConfig
from app.entity_aug.inprocess import run_ea_in_process
from app.entity_aug.predict_server import run_ea_predict
from app.entity_aug.server import run_ea_primary
from app.vfl.inprocess import run_experiment as run_vfl_in_process
from app.vfl.predict_server import run_predict
from app.vfl.server import run_primary

SERVER_RUNS = {"vfl": run_primary, "entity-aug": run_ea_primary}  # (grid, cfg) -> summary
IN_PROCESS_RUNS = {"vfl": run_vfl_in_process, "entity-aug": run_ea_in_process}  # (cfg, out) -> summary
PREDICT_RUNS = {"vfl": run_predict, "entity-aug": run_ea_predict}  # (grid, cfg) -> what predict did


def serve(grid: Grid, cfg: RunConfig) -> dict:
    """The ServerApp's run of the configured mode, or predict with a kept federation
    (run-config ``predict-run``; either mode)."""
    if cfg.predicting():
        return PREDICT_RUNS[cfg.train.mode](grid, cfg)
    return SERVER_RUNS[cfg.train.mode](grid, cfg)


def run_experiment(cfg: RunConfig, out: Path) -> dict:
    """A whole run of the configured mode in one process, recorded in ``out`` like the ServerApp
    (app/run_record.py, app/run_status.py). It does not resume: a sweep resumes whole runs."""
    if cfg.predicting():
        raise ConfigError(
            "run_experiment trains; predict in process with app.vfl.predict (python -m "
            "app.vfl.predict_csv) or through `flwr run` with predict-run"
        )
    if cfg.train.resume:
        raise ConfigError(
            "run_experiment (the sweeps' in-process engine) does not resume from checkpoints: "
            "a sweep resumes at run granularity; use `flwr run` with resume=true"
        )
    return IN_PROCESS_RUNS[cfg.train.mode](cfg, Path(out))
