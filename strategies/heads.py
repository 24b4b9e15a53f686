"""Task heads: loss on the model's raw output, predictions and metrics in original units."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

LOWER_IS_BETTER = ("rmse", "log_loss")
PROBA_FLOOR = 1e-7  # the least probability the log loss reads: one confident mistake costs at most ~16


def better(a: float, b: float, key: str) -> bool:
    """Is value a of ``key`` better than b (rmse and log loss: lower; accuracy: higher)? NaN (a
    diverged model) is worse than any number."""
    if math.isnan(a) or math.isnan(b):
        return not math.isnan(a)
    return a < b if key in LOWER_IS_BETTER else a > b


@dataclass(frozen=True)
class TaskHead:
    """regression: sigmoid output, MSE on y min-max scaled with the training labels;
    binary: BCE on a logit; multiclass: cross-entropy on logits.

    ``select``: what chooses the reported epoch and stops a run early: "metric" (the key metric:
    the paper's rule, kept by fixed-epoch runs) or "loss" (a classifier's validation log loss,
    for runs that stop early: accuracy on a few hundred validation rows moves by several points
    by chance, so it stopped runs that were still learning; regression's key metric is its loss
    already)."""

    task: str
    n_classes: int = 1
    y_min: float = 0.0
    y_max: float = 1.0
    select: str = "metric"

    @classmethod
    def fit(cls, task: str, y_train: np.ndarray, n_classes: int, early_stopping: bool = False) -> "TaskHead":
        """The head for labels ``y_train``; a classifier that stops early (patience > 0) selects on its loss."""
        if task == "regression":
            lo, hi = float(y_train.min()), float(y_train.max())
            return cls(task, 1, lo, hi if hi > lo else lo + 1.0)
        return cls(task, n_classes, select="loss" if early_stopping else "metric")

    @property
    def d_out(self) -> int:
        return self.n_classes if self.task == "multiclass" else 1

    @property
    def squash_pairs(self) -> bool:
        return self.task != "multiclass"

    def target(self, y: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        if self.task == "regression":
            return torch.as_tensor((y - self.y_min) / (self.y_max - self.y_min), device=device, dtype=dtype)
        if self.task == "binary":
            return torch.as_tensor(y, device=device, dtype=dtype)
        return torch.as_tensor(y, device=device, dtype=torch.long)

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.task == "regression":
            return F.mse_loss(torch.sigmoid(out.squeeze(-1)), target)
        if self.task == "binary":
            return F.binary_cross_entropy_with_logits(out.squeeze(-1), target)
        return F.cross_entropy(out, target)

    def predict(self, out: torch.Tensor) -> np.ndarray:
        """Regression: value in original units; binary: P(y=1); multiclass: class id."""
        if self.task == "regression":
            return torch.sigmoid(out.squeeze(-1)).cpu().numpy() * (self.y_max - self.y_min) + self.y_min
        if self.task == "binary":
            return torch.sigmoid(out.squeeze(-1)).cpu().numpy()
        return out.argmax(-1).cpu().numpy()

    def probabilities(self, out: torch.Tensor) -> np.ndarray | None:
        """Classification: (B, C) class probabilities (binary: C = 2); regression: None."""
        if self.task == "regression":
            return None
        if self.task == "binary":
            p1 = torch.sigmoid(out.squeeze(-1))
            return torch.stack([1 - p1, p1], dim=-1).cpu().numpy()
        return torch.softmax(out, dim=-1).cpu().numpy()

    def evaluation(self, out: torch.Tensor, y: np.ndarray) -> dict[str, float]:
        """The metrics of raw outputs ``out`` (N, d_out) on labels ``y`` (N,), from their
        predictions and (a classifier) class probabilities, as predict's output gives them."""
        return self.metrics(self.predict(out), y, self.probabilities(out))

    def metrics(self, pred: np.ndarray, y: np.ndarray, proba: np.ndarray | None = None) -> dict[str, float]:
        """Regression: rmse, r2; classification: accuracy, and with the class probabilities
        ``proba`` (N, C) the log loss: the labels' mean negative log-likelihood, each probability
        floored at :data:`PROBA_FLOOR` (float32 rounds a confident sigmoid to exactly 1)."""
        if proba is not None and self.task != "regression":
            p = proba.astype(np.float64)[np.arange(len(y)), np.asarray(y, dtype=np.int64)]  # (N,)
            return {**self.metrics(pred, y), "log_loss": float(-np.log(np.maximum(p, PROBA_FLOOR)).mean())}
        if self.task == "regression":
            err = pred - y
            ss_tot = float(((y - y.mean()) ** 2).sum())
            return {"rmse": float(np.sqrt((err**2).mean())), "r2": 1.0 - float((err**2).sum()) / max(ss_tot, 1e-12)}
        if self.task == "binary":
            return {"accuracy": float(((pred > 0.5) == (y == 1)).mean())}
        return {"accuracy": float((pred == y).mean())}

    @property
    def key_metric(self) -> str:
        return "rmse" if self.task == "regression" else "accuracy"

    @property
    def selection_key(self) -> str:
        """The validation value that chooses the reported epoch and stops early (``select``)."""
        return "log_loss" if self.select == "loss" else self.key_metric

    def better(self, a: float, b: float, key: str | None = None) -> bool:
        """:func:`better` for ``key``, by default the key metric."""
        return better(a, b, key or self.key_metric)

    def selects(self, a: dict[str, float], b: dict[str, float]) -> bool:
        """Are validation values ``a`` better than ``b`` by the selection key? An epoch recorded
        before evaluations recorded the log loss (a checkpoint of an older version, resumed) has
        only its key metric, and is compared on that."""
        key = self.selection_key if self.selection_key in a and self.selection_key in b else self.key_metric
        return self.better(a[key], b[key], key)

    def constant_metrics(self, y_train: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """The metrics on labels ``y`` (n,) of the best constant fitted on the training labels only:
        their mean (regression), the majority class (binary: P(y=1) = the positive share)."""
        if self.task == "regression":
            constant = float(np.mean(y_train))
        elif self.task == "binary":
            constant = float(np.mean(y_train == 1))
        else:
            constant = int(np.bincount(np.asarray(y_train, dtype=np.int64), minlength=self.n_classes).argmax())
        return self.metrics(np.full(len(y), constant), np.asarray(y))
