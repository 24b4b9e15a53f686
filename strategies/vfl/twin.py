"""The one-process twin: the same modules trained in one autograd graph, no Flower.

It is the oracle for the federated protocol. Each secondary's local model runs per
(record, neighbour) pair inside the graph (no de-duplication, no tokens on the wire), and
the S-step window is expressed as a straight-through embedding: the value the primary sees
is the embedding computed from the secondary's weights at the start of the window, while
the gradient flows into a forward pass at the secondary's current weights, which is what
the federated secondary does when it replays its gradient blocks. Pipelined, the value is the
one from the previous window's start (each epoch's first two windows: the epoch's start).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from linkage.contracts import PrimaryLinkage
from strategies.heads import TaskHead
from strategies.optim import make_optimizer, set_lr
from strategies.schedule import epoch_batches, windows
from strategies.shields import RowShield
from strategies.vfl.defences import GradientDefence, SentGradients
from strategies.vfl.model import SimilarityModel
from strategies.vfl.primary import Optim
from strategies.vfl.protocol import TrainPlan


@dataclass(frozen=True)
class TwinParties:
    """Every party's pieces in one process: the primary's model, head, features (n, d) and labels,
    the linkage, and per secondary its local model, features (m_p, d_p) and token -> row map."""

    model: SimilarityModel
    head: TaskHead
    x: np.ndarray
    y: np.ndarray
    linkage: PrimaryLinkage | None
    secondary_models: dict[str, nn.Module]
    secondary_x: dict[str, np.ndarray]
    row_of_token: dict[str, np.ndarray]
    shields: dict[str, RowShield] = field(default_factory=dict)  # per secondary its level's embedding defence
    defence: GradientDefence = GradientDefence()  # the primary's defence of the gradients it sends


def train_twin(
    parties: TwinParties,
    train_rows: np.ndarray,
    plan: TrainPlan,
    optim: Optim,
    on: tuple[torch.device, torch.dtype],
    lr_scales: list[float] | None = None,
) -> list[float]:
    """Train the parties' models in place ``on`` (device, dtype), every party with ``optim``'s
    settings, as the federated parties do; returns the loss of every step. ``lr_scales``: per
    epoch the fraction of the lr every party trains at (the twin evaluates nothing, so a federated
    run's schedule, its records' ``lr_scale``, is given; None = constant)."""
    (device, dtype), lr, weight_decay = on, optim.lr, optim.weight_decay
    model, head, secondary_models = parties.model, parties.head, parties.secondary_models
    model.to(device=device, dtype=dtype)
    xt = torch.as_tensor(parties.x, device=device, dtype=dtype)
    sx = {p: torch.as_tensor(parties.secondary_x[p], device=device, dtype=dtype) for p in secondary_models}
    for m in secondary_models.values():
        m.to(device=device, dtype=dtype)
    optimizers = [make_optimizer(model.optimizer_groups(), lr, weight_decay)]
    optimizers += [make_optimizer(m.parameters(), lr, weight_decay) for m in secondary_models.values()]
    losses: list[float] = []
    defended = _Defended(parties, device) if parties.defence.on and secondary_models else None
    for epoch in range(plan.stop.epochs):
        for opt in optimizers:
            set_lr(opt, lr * (lr_scales[epoch] if lr_scales else 1.0))
        batches = epoch_batches(train_rows, plan.batch_size, plan.seed, epoch)
        if plan.stop.max_steps:
            batches = batches[: max(0, plan.stop.max_steps - len(losses))]
        previous = None
        for window in windows(batches, plan.steps_per_exchange):
            with torch.no_grad():
                fresh = {p: _sent(parties, p, m(sx[p])) for p, m in secondary_models.items()}  # (n, c) at window start
            # pipelined, window w sees the weights at window w - 1's start (strategies/vfl/protocol.py)
            stale, previous = (previous if plan.pipeline and previous is not None else fresh), fresh
            for rows in window:
                model.train()
                target = head.target(parties.y[rows], device, dtype)
                pairs, index = _pairs(parties, sx, stale, rows, device, defended is None)
                out = model(xt[rows], pairs, index, _sims(parties, rows, device, dtype))
                loss = head.loss(out, target)
                for opt in optimizers:
                    opt.zero_grad(set_to_none=True)
                loss.backward()
                if defended is not None:
                    defended.backward(sx, rows, pairs, target)
                for opt in optimizers:
                    opt.step()
                losses.append(float(loss.detach()))
                for p, shield in parties.shields.items():  # as each party after its step
                    shield.stepped(len(losses), lambda p=p: secondary_models[p](sx[p]))
        if plan.stop.max_steps and len(losses) >= plan.stop.max_steps:
            break
    return losses


def _pairs(
    parties: TwinParties,
    sx: dict[str, torch.Tensor],
    stale: dict[str, torch.Tensor],
    rows: np.ndarray,
    device: torch.device,
    straight: bool = True,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per secondary, one embedding per (record, neighbour) pair with the window's straight-through
    value; not ``straight``: the stale values as leaves, whose gradients :class:`_Defended` sends."""
    pairs, index = {}, {}
    for p, m in parties.secondary_models.items():
        r = torch.as_tensor(parties.row_of_token[p][parties.linkage.tokens[p][rows]], device=device)  # (B, K)
        index[p] = torch.arange(r.numel(), device=device).view(r.shape)  # (B, K)
        if not straight:
            pairs[p] = stale[p][r.flatten()].detach().requires_grad_(True)  # (B*K, c)
            continue
        live = m(sx[p][r.flatten()])  # (B*K, c): one row per pair, duplicates included
        live = parties.shields[p].clipped(live) if p in parties.shields else live
        pairs[p] = stale[p][r.flatten()] + (live - live.detach())
    return pairs, index


class _Defended:
    """The primary's gradient defence in the twin: per party (in the primary's order) each
    record's pair gradients clipped and noised into one block row per distinct token
    (strategies/vfl/defences.py, the same secret stream and calibrated clips as the primary's),
    and the block backpropagated through a fresh forward of the token's row, as the secondary
    does. The math of the block is the primary's own (an oracle of the protocol around it)."""

    def __init__(self, parties: TwinParties, device: torch.device) -> None:
        self.parties, self.device = parties, device
        self.sent = SentGradients(parties.defence, parties.model.parties, device)

    def backward(self, sx: dict[str, torch.Tensor], rows: np.ndarray, pairs: dict, target: torch.Tensor) -> None:
        tw = self.parties
        for p in tw.model.parties:
            tokens, inverse = np.unique(tw.linkage.tokens[p][rows], return_inverse=True)  # (U,), (B * K,)
            b, k = len(rows), tw.linkage.tokens[p].shape[1]
            index = torch.as_tensor(inverse.reshape(b, k), device=self.device)  # (B, K)
            block = self.sent.block(p, pairs[p].grad.view(b, k, -1), index, len(tokens), target)
            live = tw.secondary_models[p](sx[p][torch.as_tensor(tw.row_of_token[p][tokens], device=self.device)])
            (tw.shields[p].clipped(live) if p in tw.shields else live).backward(block)  # (U, c)


def _sent(parties: TwinParties, p: str, every: torch.Tensor) -> torch.Tensor:
    """(n, c) party p's embeddings of all its records as it sends them (its shield applied,
    calibrated on them at the first send, as the party does)."""
    shield = parties.shields.get(p)
    if shield is None:
        return every
    return shield.ready(lambda: every).send(every, torch.arange(len(every), device=every.device))


def _sims(
    parties: TwinParties, rows: np.ndarray, device: torch.device, dtype: torch.dtype
) -> dict[str, torch.Tensor] | None:
    """The batch's similarities {path: (B, K)}: one shared block, or one per secondary."""
    if not parties.secondary_models:
        return None
    linkage = parties.linkage
    per_path = (
        {"all": linkage.sims}
        if parties.model.shared_sims
        else {p: linkage.links[p].sims for p in parties.secondary_models}
    )
    return {k: torch.as_tensor(s[rows], device=device, dtype=dtype) for k, s in per_path.items()}
