"""The batch schedule shared by the federated run and its one-process twin."""

from __future__ import annotations

import numpy as np


def epoch_batches(train_rows: np.ndarray, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Seeded shuffle of the training rows for one epoch, cut into batches (last may be short)."""
    perm = np.random.default_rng([seed, 11, epoch]).permutation(train_rows)
    return [perm[i : i + batch_size] for i in range(0, len(perm), batch_size)]


def windows(batches: list[np.ndarray], steps_per_exchange: int) -> list[list[np.ndarray]]:
    """Group consecutive batches into windows of S steps: one exchange serves one window."""
    s = steps_per_exchange
    return [batches[i : i + s] for i in range(0, len(batches), s)]
