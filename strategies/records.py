"""What both training modes record per epoch, and the choice of the reported epoch: the best
validation metric (test metrics are reported, never used to choose)."""

from __future__ import annotations

from dataclasses import dataclass, field

from strategies.heads import TaskHead


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


def best_epoch(records: list[EpochRecord], head: TaskHead) -> EpochRecord:
    """The epoch with the best validation value of the head's key metric (the first on ties)."""
    key = head.key_metric
    best = records[0]
    for rec in records[1:]:
        if head.better(rec.val[key], best.val[key]):
            best = rec
    return best
