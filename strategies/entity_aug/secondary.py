"""Entity Augmentation's secondary (the EA paper's guest; also the primary's own feature block,
served in process as one more party): its local model over its own records, the activations it
sends (defended at its privacy level: strategies/shields.py) and the gradients it applies.
Shapes: B entities per step, c activation width, n the party's records."""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from strategies.entity_aug.channel import StepReply, StepRequest
from strategies.entity_aug.model import BatchSchedule
from strategies.optim import backward_from
from strategies.shields import RowShield, Shielded
from strategies.wire_checks import Expect, check_block


class SecondaryParty(Shielded):
    """A secondary's side (the EA paper's guest; also the primary's own feature block, served in
    process as one more party): its local model over its own records. Each step it first applies
    the primary's gradient for its
    previous activation (fresh forward pass of the same entities, then one optimiser step),
    then sends the activations of its next batch.

    ``fault_delay``: test hook, seconds to sleep before answering odd training steps."""

    def __init__(
        self,
        name: str,
        features: np.ndarray,
        schedule: BatchSchedule,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        on: tuple[torch.device, torch.dtype],
        fault_delay: float = 0.0,
    ) -> None:
        """``features`` (n, d_p) by entity id, held ``on`` (device, dtype)."""
        self.name, self.schedule, self.model, self.optimizer = name, schedule, model, optimizer
        (self.device, self.dtype), self.fault_delay = on, fault_delay
        self.x = torch.as_tensor(features, device=self.device, dtype=self.dtype)  # (n, d_p) by entity id
        self.pending: np.ndarray | None = None  # ids of the last activation sent
        self._stream: tuple[int, np.ndarray] | None = None
        self.row_shield: RowShield | None = None  # its privacy level's defence of what it sends (:meth:`protect`)
        self.applied = 0  # gradients applied: the shield recalibrates every RowShield.RECALIBRATE

    def protect(self, shield: RowShield | None) -> None:
        """Send activations clipped and noised per record from now on (strategies/vfl/defences.py)."""
        self.row_shield = shield

    def step(self, req: StepRequest) -> StepReply:
        if self.fault_delay and req.step % 2 == 1:
            time.sleep(self.fault_delay)
        if req.grad is not None and self.pending is not None:
            self.apply(self.pending, req.grad)
        self.pending = None
        if req.step < 0:
            return StepReply(np.empty(0, dtype=np.int64), np.empty((0, 0), dtype=np.float32))
        if self._stream is None or self._stream[0] != req.epoch:
            self._stream = (req.epoch, self.schedule.stream(req.epoch))
        ids = self.schedule.batch(self._stream[1], req.step)
        act = self.embed(ids)  # (B, c)
        self.pending = ids
        return StepReply(ids, act)

    def apply(self, ids: np.ndarray, grad: np.ndarray) -> None:
        out = self.model(self.x[torch.as_tensor(ids, device=self.device)])  # (B, c)
        if self.row_shield is not None:
            out = self.row_shield.ready(self._every).clipped(out)  # the clip's own gradient (the noise: a constant)
        # one row per entity it sent, its cut size, in its own dtype, within the bound: else refused
        check_block(grad, Expect("the primary", "gradient", "train.ea_step", tuple(out.shape), self.dtype, self.name))
        self.optimizer.zero_grad(set_to_none=True)
        backward_from(out, torch.as_tensor(grad, device=self.device, dtype=self.dtype))  # (B, c)
        self.optimizer.step()
        self.applied += 1
        if self.row_shield is not None:
            self.row_shield.stepped(self.applied, self._every)

    @torch.no_grad()
    def embed(self, ids: np.ndarray) -> np.ndarray:
        """(n,) entity ids -> (n, c) activations as sent (its shield applied)."""
        rows = torch.as_tensor(ids, device=self.device)
        out = self.model(self.x[rows])  # (n, c)
        return (out if self.row_shield is None else self.row_shield.ready(self._every).send(out, rows)).cpu().numpy()

    def _every(self) -> torch.Tensor:
        """(n, c) this party's activations of all its records (its shield's calibration)."""
        return self.model(self.x)
