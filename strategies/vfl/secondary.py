"""A secondary party's part of the protocol, with no transport and no run config: its rows (the
linkage's token -> row map), its local model and optimiser, and the defence on what it sends.
It answers a step (:meth:`SecondaryParty.step`: a StepRequest in, a StepReply out): applies the
primary's gradient blocks, each checked before any is applied, in order, and embeds the rows the
step asks for. app/vfl/secondary.py builds it from a run config and keeps it between Flower
messages (its folders: :class:`StepFolders`); the in-process channel calls it directly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn

from strategies.optim import backward_from, set_lr
from strategies.shields import RowShield, Shielded, level_shield, secret_generator
from strategies.vfl.defences import ClipNoise, clipped_rows
from strategies.vfl.wire import GradBlock, StepMeta, StepReply, StepRequest, require_lr_scale, step_digest
from strategies.wire_checks import Expect, PeerValueError, check_block, require_finite


class MisalignedStep(RuntimeError):
    """A step message that does not fit this party's linkage job or training position."""


def with_imputed_row(features: np.ndarray, row_of_token: np.ndarray, party: str) -> np.ndarray:
    """The party's rows. A linkage that maps tokens to row n of an n-row party (Exact: records
    without an exact match) gets that extra row as the party's mean features. A chain's map has
    the anchor's length and may point at any of the party's rows."""
    top = int(row_of_token.max()) if len(row_of_token) else -1
    if top == len(features):
        return np.vstack([features, features.mean(0, keepdims=True)])
    if top > len(features):
        raise ValueError(
            f"party {party!r}: linkage job maps tokens to row {top} but the party has {len(features)} rows"
        )
    return features


@dataclass(frozen=True)
class LinkedRows:
    """What the linkage gave this party: its job, and the row of its data each token names."""

    job_id: str
    row_of_token: np.ndarray  # (T,) int


@dataclass
class Local:
    """The party's own: its rows' features, its model (d_S -> c) and that model's optimiser."""

    x: torch.Tensor  # (n, d_S), on the party's device, in its dtype
    model: nn.Module
    optimizer: torch.optim.Optimizer
    lr: float  # its own learning rate; a step's lr_scale (the primary's schedule) only lowers it
    cut_dim: int  # c: the width of its embeddings and of their gradients


class StepFolders(Protocol):
    """Where a step's keep and save go: the party's own folders for the run (app/vfl/client.py on
    a node; the run's checkpoint folder in process)."""

    def keep(self, party: "SecondaryParty", run: str, epoch: int, attempts: dict[str, str]) -> None:
        """Keep the party's current state as its model of ``run`` (the best epoch so far) under its
        training attempt; ``attempts``: {"attempt", "previous"} (app/kept.py kept_attempts)."""

    def save(self, party: "SecondaryParty", run: str, epoch: int) -> str:
        """Checkpoint the party for ``run`` at ``epoch``; returns the checkpoint's digest."""


class SecondaryParty(Shielded):
    def __init__(self, party: str, rows: LinkedRows, local: Local, shield: ClipNoise, level: str) -> None:
        self.party, self.job_id, self.row_of_token = party, rows.job_id, rows.row_of_token
        self.x, self.model, self.optimizer, self.cut_dim = local.x, local.model, local.optimizer, local.cut_dim
        self.device, self.dtype = self.x.device, self.x.dtype
        self.lr = local.lr
        self.applied = 0  # gradient blocks applied so far (the step cursor)
        # the embeddings it sends clipped and noised (strategies/vfl/defences.py), from its own secret:
        # as its explicit embedding-clip / -noise say, else as its privacy level says (a RowShield)
        self.shield = shield
        self.noise = secret_generator(self.device, f"embedding-noise/{party}") if shield.noise > 0 else None
        like = torch.empty(0, self.cut_dim, device=self.device, dtype=self.dtype)  # (0, c)
        self.row_shield: RowShield | None = level_shield(level, shield.on, len(self.x), like, party)

    # ------------------------------------------------------------------ protocol steps

    def rows(self, tokens: np.ndarray) -> torch.Tensor:
        if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            found = f"{tokens.dtype} {tokens.shape}" if isinstance(tokens, np.ndarray) else type(tokens).__name__
            raise PeerValueError(
                f"party {self.party!r}: tokens from the primary must be one vector of integers, got {found}"
            )
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= len(self.row_of_token)):
            raise PeerValueError(f"party {self.party!r}: token out of range [0, {len(self.row_of_token)})")
        return torch.as_tensor(self.row_of_token[tokens], device=self.device)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """(U,) tokens -> (U, c) embeddings from the current weights, a host array (a message's)."""
        return self.embed_tensor(tokens).cpu().numpy()

    @torch.no_grad()
    def embed_tensor(self, tokens: np.ndarray) -> torch.Tensor:
        """:meth:`embed` on this party's device (an in-process channel's: no host round trip)."""
        return self.embed_rows(self.rows(tokens))

    @torch.no_grad()
    def embed_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """(R,) rows of this party -> (R, c) embeddings as it sends them: clipped and noised where
        the run's embedding defence says."""
        if self.row_shield is not None:
            return self.row_shield.ready(self._every).send(self.model(self.x[rows]), rows)
        return clipped_rows(self.model(self.x[rows]), self.shield, self.noise)

    def apply(self, blocks: list[GradBlock], lr_scale: float = 1.0) -> None:
        """Backpropagate each block's gradient through a fresh forward pass, one step each, at
        ``lr_scale`` (0, 1] of this party's learning rate (the primary's schedule).
        Every block is checked first (:meth:`_checked`): a refused message changes no weight."""
        grads = self._checked(blocks, lr_scale)
        set_lr(self.optimizer, self.lr * lr_scale)
        for block, grad in zip(blocks, grads):
            out = self.model(self.x[self.rows(block.tokens)])  # (U, c)
            out = clipped_rows(out, ClipNoise(self.shield.clip), None)  # the clip's own gradient (noise: a constant)
            if self.row_shield is not None:
                out = self.row_shield.ready(self._every).clipped(out)
            self.optimizer.zero_grad(set_to_none=True)
            backward_from(out, grad)  # (U, c), its shape checked above
            self.optimizer.step()
            self.applied += 1
            if self.row_shield is not None:
                self.row_shield.stepped(self.applied, self._every)

    def _checked(self, blocks: list[GradBlock], lr_scale: float) -> list[torch.Tensor]:
        """The blocks' gradients as (U, c) tensors on this party's device, every one checked: finite
        in this party's dtype, tokens in range, one row per token. The gradients may be host arrays
        (a message's) or tensors (an in-process primary's); all blocks' finiteness is read back in
        one host sync, not one per block."""
        require_lr_scale(lr_scale, f"party {self.party!r}")
        for j, block in enumerate(blocks):  # a message's arrays: exactly (U, c) in this party's dtype, bounded
            self.rows(block.tokens)
            shape = (len(block.tokens), self.cut_dim)
            check_block(
                block.grad,
                Expect("the primary", f"gradient block {j}", "train.step", shape, self.dtype, self.party),
            )
        grads = [torch.as_tensor(b.grad, device=self.device, dtype=self.dtype) for b in blocks]  # each (U, c)
        finite = torch.stack([g.isfinite().all() for g in grads]).tolist() if grads else []
        for j, (block, grad) in enumerate(zip(blocks, grads)):
            if not finite[j]:
                require_finite(grad, self.party, f"gradient block {j} (as {self.dtype})", "train.step")
            want = (len(block.tokens), self.cut_dim)
            if tuple(grad.shape) != want:
                raise ValueError(
                    f"party {self.party!r}: gradient block {j} in train.step has shape "
                    f"{tuple(grad.shape)}, expected {want} (one row per token, cut size {self.cut_dim})"
                )
        return grads

    def _every(self) -> torch.Tensor:
        """(n, c) this party's embeddings of all its records (its shield's calibration)."""
        return self.model(self.x)

    def check(self, meta: StepMeta, blocks: list[GradBlock], tokens: np.ndarray) -> None:
        """Refuse a step that belongs to another linkage job, another training position, or
        whose token lists are not the ones the primary hashed: never train on wrong rows."""
        if meta.job_id != self.job_id:
            raise MisalignedStep(
                f"party {self.party!r}: step for linkage job {meta.job_id!r}, but this party "
                f"holds job {self.job_id!r}; refusing to train on misaligned rows"
            )
        if meta.cursor != self.applied:
            raise MisalignedStep(
                f"party {self.party!r}: the primary is at step {meta.cursor} but this party has "
                f"applied {self.applied} gradient blocks (a lost message or a restore from another "
                "checkpoint); refusing to continue"
            )
        if step_digest(meta.job_id, meta.cursor, blocks, tokens, meta.lr_scale) != meta.digest:
            raise MisalignedStep(
                f"party {self.party!r}: the step's token lists do not match their digest "
                f"(cursor {meta.cursor}); refusing to train on misaligned rows"
            )

    def step(self, req: StepRequest, folders: StepFolders) -> StepReply:
        """One step as the primary asked: checked (:meth:`check`) before anything changes; the
        state kept first if asked; the blocks applied; a checkpoint if asked; then the
        embeddings of the request's tokens (a tensor on this party's device: the transport
        copies it to the host when it encodes the reply)."""
        self.check(req.meta, req.apply, req.tokens)
        if req.keep is not None:  # the last evaluated epoch is the best so far: keep it before training on
            run, epoch, attempt, previous = req.keep
            folders.keep(self, run, epoch, {"attempt": attempt, "previous": previous})
        self.apply(req.apply, req.lr_scale)
        state = None
        if req.save is not None:  # end of an epoch: checkpoint, then embed for the evaluation
            run, epoch = req.save
            state = {"digest": folders.save(self, run, epoch), "applied": self.applied, "epoch": epoch}
        return StepReply(self.embed_tensor(req.tokens), state, self.applied)
