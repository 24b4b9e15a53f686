"""A run's record on disk: one schema, written by this module for every engine (``flwr run``,
in-process) and both training modes (FedSim and its baselines, Entity Augmentation).

    config.json       {"run": the RunConfig's fields, "resolved": the settings it resolved to}
    metrics.jsonl     one line per epoch: an EpochRecord (strategies/records.py) plus the mode's
                      extra fields (traffic so far; stale counts); flushed, so a running run shows
                      its progress, and a resumed run rewrites the epochs it keeps first
    summary.json      written last, only by a run that finished (status.json: app/run_status.py)
    step_losses.npy   (steps,) the training loss of every step
    primary_model.pt  the primary's (host's) final state dict

summary.json, every run:
    dataset, mode, method, seed, engine ("flower" | "inprocess"), device, machine,
    best_epoch, val, test   the best-validation epoch and its metrics (test never chooses),
    epochs_run, steps,
    seconds     {"total", "load", "linkage", "train_and_eval", "epochs": [training s per epoch]},
    exchange    {"count", "bytes_down", "bytes_up", ...} over Flower; null in process,
    preprocessing, and the mode's own fields (FedSim: k, tau, steps_per_exchange;
    Entity Augmentation: ea_variant, overlap, entities, stale, ...).

Readers (experiments/, bench/) use :func:`read_summary`, which also reads records written before
this schema (``seconds`` a number) as ``{"total": n}``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from strategies.records import EpochRecord, best_epoch

CONFIG, METRICS, SUMMARY = "config.json", "metrics.jsonl", "summary.json"
LOSSES, MODEL = "step_losses.npy", "primary_model.pt"
FILES = (SUMMARY, METRICS, LOSSES, MODEL, CONFIG)  # what a fresh run replaces (app/run_status.py)
FOLDERS = ("kept",)  # likewise: the kept federation of the best epoch (app/vfl/kept.py)


@dataclass
class Seconds:
    """Wall seconds of a run's phases; ``epochs``: training seconds of each epoch."""

    total: float = 0.0
    load: float = 0.0
    linkage: float = 0.0
    train_and_eval: float = 0.0
    epochs: list[float] = field(default_factory=list)


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
    return (f"{platform.node()}: {os.cpu_count()} cores ({cpu}), {gpu}, Python {platform.python_version()}, "
            f"torch {torch.__version__}")


class RunRecord:
    """The files of one run folder, written in the order above."""

    def __init__(self, folder: Path, engine: str) -> None:
        self.folder, self.engine = Path(folder), engine
        self._metrics = None

    def write_config(self, cfg, settings) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        body = {"run": dataclasses.asdict(cfg), "resolved": dataclasses.asdict(settings)}
        (self.folder / CONFIG).write_text(json.dumps(body, indent=2))

    def open_metrics(self, kept: list[EpochRecord] = ()) -> None:
        """Start metrics.jsonl afresh with the epochs a resumed run keeps."""
        self._metrics = (self.folder / METRICS).open("w")
        for rec in kept:
            self.epoch(rec)

    def epoch(self, rec: EpochRecord, **extra) -> None:
        self._metrics.write(json.dumps({**dataclasses.asdict(rec), **extra}) + "\n")
        self._metrics.flush()

    def close_metrics(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    def finish(self, cfg, *, dataset: str, method: str, head, records: list[EpochRecord], losses: list[float],
               model, device, seconds: Seconds, preprocessing: dict, exchange: dict | None = None,
               **mode_fields) -> dict:
        """The end of a finished run: losses, model (a torch module), then summary.json; returns
        the summary. ``head``: the TaskHead that picks the best epoch."""
        import torch

        self.close_metrics()
        np.save(self.folder / LOSSES, np.asarray(losses, dtype=np.float64))
        torch.save(model.state_dict(), self.folder / MODEL)
        best = best_epoch(records, head)
        seconds.epochs = seconds.epochs or [r.seconds for r in records]
        summary = {"dataset": dataset, "mode": cfg.mode, "method": method,
                   "seed": cfg.seed, "engine": self.engine, "device": str(device), "machine": machine(),
                   "best_epoch": best.epoch, "val": best.val, "test": best.test, "epochs_run": len(records),
                   "steps": len(losses), "seconds": dataclasses.asdict(seconds), "exchange": exchange,
                   "preprocessing": preprocessing, **mode_fields}
        (self.folder / SUMMARY).write_text(json.dumps(summary, indent=2))
        return summary


def read_summary(folder: Path) -> dict:
    """A run's summary.json; a record from before this schema (``seconds`` a number) reads as
    ``{"total": n}``."""
    summary = json.loads((Path(folder) / SUMMARY).read_text())
    if isinstance(summary.get("seconds"), (int, float)):
        summary["seconds"] = dataclasses.asdict(Seconds(total=float(summary["seconds"])))
    return summary


def read_metrics(folder: Path) -> list[dict]:
    """metrics.jsonl as a list of per-epoch dicts."""
    return [json.loads(line) for line in (Path(folder) / METRICS).read_text().splitlines()]
