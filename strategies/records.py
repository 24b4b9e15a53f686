"""What both training modes record per epoch, the choice of the reported epoch (the best
validation value of the head's selection key: the key metric, or a classifier's log loss in a run
that stops early; test metrics are reported, never used to choose), and when training stops.

Stopping is a function of the records alone, so every engine (``flwr run``, in process) and a
run resumed from its checkpoint (which holds the records) stop at the same epoch: with
``patience`` N > 0, training stops once N epochs in a row brought no better validation value
than the best before them; ``patience`` 0 = fixed epochs (the reproduction presets). With
``max_minutes`` > 0 it also stops after the epoch in which the epochs' recorded seconds, training
and evaluation, reached that budget (:func:`out_of_time`).

The learning-rate schedule is a function of the records too (:func:`lr_scale`, after
torch's ReduceLROnPlateau): every ``lr_patience`` epochs in a row without a better validation
value (counted from the best or from the last reduction) multiply every party's learning rate
by ``lr_decay``; ``lr_decay`` 1 = a constant rate (the paper's, and the default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from strategies.heads import TaskHead
from strategies.stop_rule import StopRule

# What the training loops report while they run: (phase "training" | "evaluation", epoch,
# steps done in this epoch, steps per epoch, the last step's loss).
Progress = Callable[[str, int, int, int, float], None]


@dataclass
class EpochRecord:
    epoch: int
    train_loss: float
    steps: int
    exchanges: int
    seconds: float  # training steps only
    eval_seconds: float = 0.0
    val: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] = field(default_factory=dict)
    # fedsim_attn: per secondary the mean attention weight by similarity rank and on the null slot
    # (last), over (at most the first 2,000) validation records; {} otherwise (fedsim report plots it)
    attention: dict[str, list[float]] = field(default_factory=dict)
    lr_scale: float = 1.0  # the fraction of the learning rate this epoch trained at (lr_scale)
    # the evaluation's predictions, {"val": eval_part(...), "test": ...}: kept with the best epoch's
    # models (app/kept.py), never written with the record (:func:`record_row`); None when not kept
    outputs: dict[str, dict[str, np.ndarray]] | None = field(default=None, repr=False, compare=False)


def record_row(rec: EpochRecord) -> dict:
    """The record as metrics.jsonl and a checkpoint hold it: every field but its outputs."""
    return {f.name: getattr(rec, f.name) for f in fields(rec) if f.name != "outputs"}


def eval_part(head: TaskHead, out: torch.Tensor, rows: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """One evaluated part's predictions from the raw outputs ``out`` (N, d_out), as predict gives
    them: {"rows": (N,) row indices, "values": (N,) head.predict, "y": (N,) labels, and a
    classifier's "proba": (N, C)}; head.metrics of them is the evaluation's metrics."""
    part = {"rows": np.asarray(rows), "values": head.predict(out), "y": np.asarray(y)}
    proba = head.probabilities(out)
    return part if proba is None else {**part, "proba": proba}


def best_epoch(records: list[EpochRecord], head: TaskHead) -> EpochRecord:
    """The epoch with the best validation value of the head's selection key (the first on ties)."""
    best = records[0]
    for rec in records[1:]:
        if head.selects(rec.val, best.val):
            best = rec
    return best


def epochs_without_improvement(records: list[EpochRecord], head: TaskHead) -> int:
    """How many epochs ran after the best one (0 when the last epoch is the best)."""
    return len(records) - 1 - records.index(best_epoch(records, head)) if records else 0


def early_stop(records: list[EpochRecord], head: TaskHead, patience: int) -> bool:
    """Stop now: ``patience`` > 0 epochs in a row after the best brought no improvement."""
    return patience > 0 and bool(records) and epochs_without_improvement(records, head) >= patience


def lr_scale(records: list[EpochRecord], head: TaskHead, decay: float, patience: int) -> float:
    """The fraction of the learning rate for the epoch after ``records`` (1 with ``decay`` 1)."""
    if decay == 1.0 or patience < 1:
        return 1.0
    scale, waited, best = 1.0, 0, None
    for rec in records:
        if best is None or head.selects(rec.val, best):
            best, waited = rec.val, 0
        else:
            waited += 1
            if waited == patience:
                scale, waited = scale * decay, 0
    return scale


def minutes_run(records: list[EpochRecord]) -> float:
    """The minutes the epochs of ``records`` took, training and evaluation."""
    return sum(rec.seconds + rec.eval_seconds for rec in records) / 60.0


def out_of_time(records: list[EpochRecord], max_minutes: float) -> bool:
    """``max_minutes`` > 0 and the epochs run took that long (a resumed run's records hold the
    epochs before it: the budget is the run's, not the process's)."""
    return max_minutes > 0 and minutes_run(records) >= max_minutes


def finished(records: list[EpochRecord], head: TaskHead, rule: StopRule, steps: int) -> bool:
    """Training ends after ``records`` (``steps`` steps run): max-steps reached, or the patience or
    max-minutes ran out. A function of the records: a resumed run stops where the whole run would."""
    return (
        bool(rule.max_steps and steps >= rule.max_steps)
        or early_stop(records, head, rule.patience)
        or out_of_time(records, rule.max_minutes)
    )


def stopping(records: list[EpochRecord], head: TaskHead, rule: StopRule, steps: int = 0) -> dict:
    """summary.json's ``stopping``: {"patience", "max_epochs", "max_minutes", "epochs_run",
    "stopped_early", "reason", "selected_on"} of a run that trained ``steps`` steps."""
    patience, max_epochs, max_steps, max_minutes = rule.patience, rule.epochs, rule.max_steps, rule.max_minutes
    run = len(records)
    early = early_stop(records, head, patience) and run < max_epochs
    if early:
        reason = (
            f"no better validation {head.selection_key} in the {patience} epochs after the best epoch "
            f"{best_epoch(records, head).epoch} (patience {patience})"
        )
    elif max_steps and steps >= max_steps:
        reason = f"max-steps {max_steps} reached"
    elif out_of_time(records, max_minutes) and run < max_epochs:
        reason = (
            f"max-minutes {max_minutes:g} reached: {run} epochs took {minutes_run(records):.1f} minutes "
            "of training and evaluation"
        )
    elif patience > 0:
        reason = f"the maximum of {max_epochs} epochs ran out before the patience ({patience}) did"
    else:
        reason = f"fixed epochs: all {max_epochs} ran (patience 0)"
    return {
        "patience": patience,
        "max_epochs": max_epochs,
        "max_minutes": max_minutes,
        "epochs_run": run,
        "stopped_early": early,
        "reason": reason,
        "selected_on": head.selection_key,  # the validation value that chose the reported epoch
    }
