"""The optimiser every party uses (LAMB, as the paper), per-party seeds, and models built from a
seed without touching the global RNG (both training modes)."""

from __future__ import annotations

import inspect
import zlib
from collections.abc import Iterable

import numpy as np
import torch

from strategies.lamb import EagerOptimizer, Lamb


class Adam(EagerOptimizer, torch.optim.Adam):
    """torch.optim.Adam (Entity Augmentation's optimiser, as its paper), without the wrappers that
    import torch's compiler (torch._dynamo, ~1.1 s of CPU in every process that builds or steps
    one): the Optimizer's methods as LAMB's (strategies/lamb.py EagerOptimizer), and the step under
    torch.no_grad, as torch's own wrapper sets it for a non-differentiable optimiser. Bit-equal to
    torch's (tests/test_lamb.py)."""

    _step = inspect.unwrap(torch.optim.Adam.step)  # the update itself, below torch's wrappers

    @torch.no_grad()
    def step(self, closure=None):
        return self._step(closure)


def make_optimizer(params: Iterable, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """LAMB with torch_optimizer.Lamb's semantics and defaults, multi-tensor (strategies/lamb.py).
    ``params``: parameters, or groups of them (dicts) whose ``lr_factor`` scales ``lr`` for them."""
    optimizer = Lamb(params, lr=lr, weight_decay=weight_decay)
    set_lr(optimizer, lr)
    return optimizer


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every parameter group's learning rate to ``lr`` (a schedule's value) times the group's own
    ``lr_factor`` (1 unless given); the state is unchanged."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_factor", 1.0)


def backward_from(out: torch.Tensor, grad: torch.Tensor) -> None:
    """``out.backward(grad)``: the same gradients, as d sum(out * grad) / d out is ``grad`` exactly
    (1.0 * g), without the shape check autograd runs for an explicit gradient, which imports sympy
    and torch's symbolic shapes (~0.6 s of CPU) in every party that receives gradients. The shapes
    are checked here instead: a broadcast would not raise."""
    if out.shape != grad.shape:
        raise ValueError(f"a gradient of shape {tuple(grad.shape)} for an output of shape {tuple(out.shape)}")
    (out * grad).sum().backward()


def party_seed(seed: int, party: str) -> int:
    """A distinct, stable seed per (run seed, party name)."""
    return int(np.random.SeedSequence([seed, zlib.crc32(party.encode())]).generate_state(1)[0])


def build_seeded(seed: int, build):
    """Build a module with parameters drawn from ``seed`` without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()
