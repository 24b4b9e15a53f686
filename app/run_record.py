"""A run's record on disk: one schema, written by this module for every engine (``flwr run``,
in-process) and both training modes (FedSim and its baselines, Entity Augmentation).

    config.json       {"run": the RunConfig's fields, "resolved": the settings it resolved to,
                       "hyperparameters": each value and its source, as in summary.json}
    metrics.jsonl     one line per epoch: an EpochRecord (strategies/records.py) plus the mode's
                      extra fields (traffic so far; stale counts); flushed, so a running run shows
                      its progress, and a resumed run rewrites the epochs it keeps first
    progress.json     while it runs (below), rewritten atomically at most about once a second
    summary.json      written last, only by a run that finished (status.json: app/run_status.py)
    split.csv         the primary's rows and the part each is in (train / val / test): columns
                      row (0-based, in the loaded table), source_line (own CSVs: the line of the
                      primary's file, header = line 1), entity_id (when the parties declare one),
                      part; summary.json's ``split`` gives its sha256, the rule and the sizes
    step_losses.npy   (steps,) the training loss of every step
    primary_model.pt  the primary's (host's) final state dict

summary.json, every run:
    dataset, mode, method, seed, engine ("flower" | "inprocess"), device, machine,
    threads     the torch / BLAS threads of the primary's process and what chose them (app/threads.py:
                threads, cpus, processes, parties, params, source, torch, deterministic); null where none was chosen
                (Entity Augmentation, whose few small Linears always run on one thread),
    best_epoch, val, test   the best-validation epoch and its metrics (classifiers: with "log_loss";
                test never chooses),
    epochs_run, steps,
    seconds     {"total", "load", "linkage", "train_and_eval", "epochs": [training s per epoch]},
    exchange    {"count", "bytes_down", "bytes_up", ...} over Flower; null in process,
    stopping    {"patience", "max_epochs", "max_minutes", "epochs_run", "stopped_early": bool, "reason": a sentence,
                "selected_on": the validation value that chose best_epoch (the key metric, or
                "log_loss" for a classifier that stops early)} (strategies/records.py: patience 0 = fixed epochs),
    hyperparameters  {name: {"value", "source"}}: "run config", "dataset default (...)", "fallback: ...",
                "paper per-method (...)", "method <m>" (app/config.py RunConfig.hyperparameters),
    constant_predictor  {"prediction": what it predicts, "val": its validation metrics}: the best
                constant fitted on the training labels (strategies/heads.py constant_metrics),
    warnings    [sentences]: the best epoch is the last one run (it may still improve); the best
                validation metric is no better than the constant predictor's; blank numeric cells
                were filled with the training mean (datasets/cells.py, counted per party and column),
    preprocessing, and the mode's own fields (FedSim: k, tau, steps_per_exchange;
    Entity Augmentation: ea_variant, overlap, entities, stale, ...).

progress.json (for a command line's progress bar; written by app/vfl/server.py, app/vfl/inprocess.py
and app/entity_aug/server.py through :class:`ProgressFile`):
    {"phase": "linkage" | "training" | "evaluation" | "done",
     "epoch": the epoch being trained or evaluated (0-based; at "done" the last one run),
     "max_epochs": at most this many epochs (the fixed count when patience is 0),
     "step": steps done in this epoch, "steps_per_epoch": its steps (0 before training),
     "loss": the last step's training loss (null before the first step),
     "val": the last evaluated epoch's validation metrics, or null,
     "best_epoch": the best validation epoch so far, or null,
     "time": unix time of this state}
"linkage" covers loading the data and linking (Entity Augmentation starts at "training"); a
failed run leaves its last state (status.json says it failed); non-finite numbers are null.

Readers (experiments/, bench/) use :func:`read_summary`, which also reads records written before
this schema (``seconds`` a number) as ``{"total": n}``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app import threads
from app.run_files import CONFIG, LOSSES, METRICS, MODEL, PROGRESS, SPLIT, SUMMARY, read_json
from files.atomic import write_atomic
from files.private import private_dir
from strategies.records import EpochRecord, best_epoch, record_row


@dataclass
class Seconds:
    """Wall seconds of a run's phases; ``epochs``: training seconds of each epoch."""

    total: float = 0.0
    load: float = 0.0
    linkage: float = 0.0
    train_and_eval: float = 0.0
    epochs: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class FinishedRun:
    """What a finished run hands :meth:`RunRecord.finish`: what it trained and how it is judged.
    ``head``: the TaskHead that picks the best epoch; ``records``, ``losses``: every epoch's and
    every step's; ``model``: the primary's torch module, on ``device``; ``stopping``: as
    strategies.records.stopping returns it; ``constant_predictor``: {"prediction", "val"};
    ``extra_warnings``: the mode's own, before the common ones (summary.json ``warnings``). The
    others are summary.json's fields of the same names."""

    dataset: str
    method: str
    head: Any
    records: list[EpochRecord]
    losses: list[float]
    model: Any
    device: Any
    seconds: Seconds
    preprocessing: dict
    stopping: dict
    hyperparameters: dict
    constant_predictor: dict
    exchange: dict | None = None
    extra_warnings: Sequence[str] = ()


def machine() -> str:
    """Where a run ran: host, cores, CPU model, GPU, Python and torch versions."""
    import torch  # here, not at the top: app/run_status.py's command line reads FILES without torch

    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{platform.node()}: {os.cpu_count()} cores ({cpu}), {gpu}, Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )


class RunRecord:
    """The files of one run folder, written in the order above. Use it as a context manager: on
    the way out (a failure too) the metrics file is closed and the progress writer stopped."""

    def __init__(self, folder: Path, engine: str) -> None:
        self.folder, self.engine = Path(folder), engine
        self._metrics = None
        self.progress: ProgressFile | None = None
        self._head, self._records = None, []
        self._split: dict | None = None

    def __enter__(self) -> "RunRecord":
        return self

    def __exit__(self, *exc) -> None:
        self.close_metrics()
        if self.progress is not None:
            self.progress.close()

    def start_progress(self, max_epochs: int, phase: str = "linkage") -> None:
        """Start progress.json (a resumed run: once its checkpoint is accepted)."""
        self.progress = ProgressFile(self.folder, max_epochs, phase)

    def step(self, phase: str, epoch: int, step: int, steps_per_epoch: int, loss: float) -> None:
        """A strategies.records.Progress: the training loop's news for progress.json."""
        if self.progress is not None:
            self.progress.step(phase, epoch, step, steps_per_epoch, loss)

    def write_config(self, cfg, settings, hyperparameters: dict) -> None:
        private_dir(self.folder)
        body = {"run": cfg.flat(), "resolved": dataclasses.asdict(settings), "hyperparameters": hyperparameters}
        (self.folder / CONFIG).write_text(json.dumps(body, indent=2))

    def write_split(self, split, n_rows: int, rule: str, source_lines=None, entity_ids=None) -> None:
        """split.csv (module docstring) from a datasets.base.Split of the primary's rows; its
        digest, ``rule`` (how the split was drawn) and sizes go into summary.json."""
        self._split = write_split_csv(self.folder / SPLIT, split, n_rows, rule, source_lines, entity_ids)

    def open_metrics(self, head, kept: list[EpochRecord] = ()) -> None:
        """Start metrics.jsonl afresh with the epochs a resumed run keeps; ``head`` (a TaskHead)
        picks progress.json's best epoch."""
        self._metrics, self._head, self._records = (self.folder / METRICS).open("w"), head, []
        for rec in kept:
            self.epoch(rec)

    def epoch(self, rec: EpochRecord, **extra) -> None:
        self._metrics.write(json.dumps({**record_row(rec), **extra}) + "\n")
        self._metrics.flush()
        self._records.append(rec)
        if self.progress is not None:
            self.progress.epoch(rec, best_epoch(self._records, self._head).epoch)

    def close_metrics(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    def finish(self, cfg, run: FinishedRun, **mode_fields) -> dict:
        """The end of a finished run: losses, model, then summary.json (with the mode's own
        ``mode_fields``); returns the summary."""
        import torch

        self.close_metrics()
        np.save(self.folder / LOSSES, np.asarray(run.losses, dtype=np.float64))
        torch.save(run.model.state_dict(), self.folder / MODEL)
        best = best_epoch(run.records, run.head)
        run.seconds.epochs = run.seconds.epochs or [r.seconds for r in run.records]
        summary = {**self._summary(cfg, run, best), **mode_fields}
        (self.folder / SUMMARY).write_text(json.dumps(summary, indent=2))
        if self.progress is not None:
            self.progress.update(epoch=run.records[-1].epoch, best_epoch=best.epoch)
            self.progress.close(done=True)
        return summary

    def _summary(self, cfg, run: FinishedRun, best: EpochRecord) -> dict:
        """summary.json's common fields (the module's docstring), in their order."""
        from datasets.cells import imputed_warnings  # lazy: no pandas for the status files' readers

        warnings = [
            *run.extra_warnings,
            *run_warnings(run.records, run.head, run.constant_predictor["val"]),
            *imputed_warnings(run.preprocessing),
        ]
        return {
            "dataset": run.dataset,
            "mode": cfg.train.mode,
            "method": run.method,
            "seed": cfg.train.seed,
            "member": cfg.train.member,  # of an ensemble: 0 = the run itself (run-config member)
            "engine": self.engine,
            "device": str(run.device),
            "machine": machine(),
            "threads": threads.recorded(),
            "best_epoch": best.epoch,
            "val": best.val,
            "test": best.test,
            "epochs_run": len(run.records),
            "steps": len(run.losses),
            "seconds": dataclasses.asdict(run.seconds),
            "exchange": run.exchange,
            "stopping": run.stopping,
            "hyperparameters": run.hyperparameters,
            "constant_predictor": run.constant_predictor,
            "warnings": warnings,
            "preprocessing": run.preprocessing,
            "split": self._split,
        }


def write_split_csv(path: Path, split, n: int, rule: str, source_lines=None, entity_ids=None) -> dict:
    """Write split.csv (0600, atomically); returns summary.json's ``split`` entry."""
    import hashlib

    import pandas as pd

    part = np.full(n, "unused", dtype=object)  # a row in none of the three (said, if ever)
    for name in ("train", "val", "test"):
        part[getattr(split, name)] = name
    columns = {"row": np.arange(n)}
    if source_lines is not None:
        columns["source_line"] = np.asarray(source_lines)  # the line the record starts on (header = line 1)
    if entity_ids is not None:
        columns["entity_id"] = np.asarray(entity_ids)
    data = pd.DataFrame({**columns, "part": part}).to_csv(index=False).encode()
    write_atomic(path, data)
    sizes = {name: int((part == name).sum()) for name in ("train", "val", "test", "unused")}
    return {"file": path.name, "sha256": hashlib.sha256(data).hexdigest(), "rule": rule, "sizes": sizes}


def read_summary(folder: Path) -> dict:
    """A run's summary.json; a record from before this schema (``seconds`` a number) reads as
    ``{"total": n}``."""
    summary = json.loads((Path(folder) / SUMMARY).read_text())
    if isinstance(summary.get("seconds"), (int, float)):
        summary["seconds"] = dataclasses.asdict(Seconds(total=float(summary["seconds"])))
    return summary


def read_metrics(folder: Path) -> list[dict]:
    """metrics.jsonl as a list of per-epoch dicts."""
    return read_json(Path(folder) / METRICS, lines=True)


def run_warnings(records: list[EpochRecord], head, constant_val: dict[str, float]) -> list[str]:
    """What a finished run should not keep quiet about: the best epoch is the last one run (more
    epochs may still help), or the best validation metric is no better than the constant's."""
    best, key, out = best_epoch(records, head), head.key_metric, []
    if best is records[-1]:
        out.append(
            f"the best validation epoch is the last one run ({best.epoch}): the model may still improve; "
            f"raise 'epochs' (or 'patience', 'max-minutes')"
        )
    if not head.better(best.val[key], constant_val[key]):
        out.append(
            f"the best validation {key} {best.val[key]:.4g} is no better than a constant predictor's "
            f"({constant_val[key]:.4g}, fitted on the training labels): the model learned nothing usable; "
            f"check the features, the linkage and the hyperparameters"
        )
    return out


def constant_predictor(head, y_train: np.ndarray, y_val: np.ndarray) -> dict:
    """summary.json's ``constant_predictor``: the best constant fitted on the training labels only."""
    what = "the training labels' mean" if head.task == "regression" else "the training labels' majority class"
    return {"prediction": what, "val": head.constant_metrics(y_train, y_val)}


def hyperparameter_lines(hyperparameters: dict) -> list[str]:
    """The run's hyperparameters for its log, one line per source (in the order the sources first
    appear): ``  source: name = value, name = value``; each source said once."""
    by_source: dict[str, list[str]] = {}
    for name, h in hyperparameters.items():
        by_source.setdefault(str(h["source"]), []).append(f"{name} = {h['value']}")
    return [f"  {source}: {', '.join(values)}" for source, values in by_source.items()]


def _finite(x):
    """JSON's view of a metric: a non-finite number (a diverged loss) is null."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    return x if not isinstance(x, float) or math.isfinite(x) else None


class ProgressFile:
    """<run>/progress.json (format in the module docstring), rewritten atomically by a background
    thread at most once every ``interval`` seconds when something changed; the first state at
    once, the last on :meth:`close`. ``step`` is a strategies.records.Progress."""

    def __init__(self, folder: Path, max_epochs: int, phase: str = "linkage", interval: float = 1.0) -> None:
        self.path, self.interval, self.writes = Path(folder) / PROGRESS, interval, 0
        self.state = {
            "phase": phase,
            "epoch": 0,
            "max_epochs": max_epochs,
            "step": 0,
            "steps_per_epoch": 0,
            "loss": None,
            "val": None,
            "best_epoch": None,
            "time": time.time(),
        }
        self._lock, self._stop, self._dirty = threading.Lock(), threading.Event(), True
        self._write()
        self._thread = threading.Thread(target=self._loop, name="progress.json", daemon=True)
        self._thread.start()

    def update(self, **fields) -> None:
        with self._lock:
            self.state.update(_finite(fields), time=time.time())
            self._dirty = True

    def step(self, phase: str, epoch: int, step: int, steps_per_epoch: int, loss: float) -> None:
        self.update(phase=phase, epoch=epoch, step=step, steps_per_epoch=steps_per_epoch, loss=loss)

    def epoch(self, rec: EpochRecord, best: int | None) -> None:
        """An evaluated epoch: its validation metrics and the best epoch so far."""
        self.update(epoch=rec.epoch, val=rec.val, best_epoch=best)

    def close(self, done: bool = False) -> None:
        """Stop the writer and write the last state; ``done``: the run finished (summary written)."""
        self._stop.set()
        self._thread.join()
        if done:
            self.update(phase="done")
        if self._dirty:
            self._write()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if self._dirty:
                self._write()

    def _write(self) -> None:
        with self._lock:
            body, self._dirty = json.dumps(self.state), False
        write_atomic(self.path, body.encode())
        self.writes += 1
