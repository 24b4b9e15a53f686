"""The optimiser every party uses (LAMB, as the paper) and per-party seeds."""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import numpy as np
import torch
import torch_optimizer


def make_optimizer(params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch_optimizer.Lamb(params, lr=lr, weight_decay=weight_decay)


def party_seed(seed: int, party: str) -> int:
    """A distinct, stable seed per (run seed, party name)."""
    return int(np.random.SeedSequence([seed, zlib.crc32(party.encode())]).generate_state(1)[0])
