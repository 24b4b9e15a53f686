"""The primary's channel to the secondaries: the contract the protocol trains through, and the
in-process channel (every party an object in this process). The Flower-backed channel is
app/vfl/channel.py; Entity Augmentation's alike pieces are in strategies/entity_aug/channel.py.

One contract for every transport. Embeddings come back as host arrays or as tensors (the
primary takes either); gradient blocks go out as host arrays (:func:`deliverable`), unless the
channel sets ``tensors = True``: then they stay the primary step's device tensors. The
in-process channel does, so parties that share the primary's device exchange no numpy round
trip; a serialising transport (Flower, the direct transport) gets numpy, copied once per exchange."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from strategies.vfl.wire import GradBlock, StepReply, StepRequest


def host(values: np.ndarray | torch.Tensor) -> np.ndarray:
    """A host numpy array of a tensor (on any device) or of an array (unchanged)."""
    return values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else values


def deliverable(channel: "SecondaryChannel", blocks: dict[str, list[GradBlock]]) -> dict[str, list[GradBlock]]:
    """The gradient blocks as ``channel`` takes them: as they are where it sets ``tensors``, else
    with host arrays (one copy per block, at the exchange, not at the step)."""
    if channel.tensors:
        return blocks
    return {p: [GradBlock(b.tokens, host(b.grad)) for b in bl] for p, bl in blocks.items()}


class SecondaryChannel(Protocol):
    """Everything the primary's driver (app/vfl/server.py), its checkpoints (app/vfl/checkpoint.py)
    and the protocol use of the secondaries; :class:`LocalChannel` implements all of it in process,
    app/vfl/channel.py over Flower's messages, app/vfl/direct.py over the parties' own links."""

    tensors: bool  # the channel takes gradient blocks as tensors (else host arrays: :func:`deliverable`)
    parties: dict  # the party objects held in this process ({} when each party is elsewhere)
    cursor: dict[str, int]  # per party, the gradient blocks it has applied
    saved: dict[str, dict]  # per party {"digest", "applied"} of the last checkpoint a step saved
    traffic: object | None  # bytes and seconds of the exchanges (app/transport.py Traffic); None in process

    def step(
        self,
        apply: dict[str, list[GradBlock]],
        embed: dict[str, np.ndarray],
        save: tuple[str, int] | None = None,
        lr_scale: float = 1.0,
    ) -> dict[str, StepReply]:
        """Apply the gradient blocks in order at ``lr_scale`` of each party's learning rate, then
        (``save`` = (folder, epoch)) checkpoint, then return each party's reply: the embeddings
        (U, c) of the tokens (U,) and what else a step answers (strategies/vfl/wire.py)."""

    def send(
        self,
        apply: dict[str, list[GradBlock]],
        embed: dict[str, np.ndarray],
        save: tuple[str, int] | None = None,
        lr_scale: float = 1.0,
    ) -> object:
        """:meth:`step` without waiting: returns a request for :meth:`receive`. At most one is
        outstanding; the parties handle requests in the order they are sent."""

    def receive(self, request: object) -> dict[str, StepReply]:
        """The replies to what a :meth:`send` asked."""

    def restore(self, folder: str, epoch: int) -> dict[str, dict]:
        """Every party loads its checkpoint of ``epoch``; per party {"digest", "applied"}."""

    def keep(self, run_dir: Path, epoch: int) -> None:
        """The epoch just evaluated is the best so far: every party keeps the state it embedded with."""

    def flush_keep(self) -> None:
        """A keep no step carried goes now."""

    def ping(self) -> float:
        """Seconds of one empty exchange with every party (the transport's own floor)."""

    def finish(self, folder: str) -> dict[str, dict]:
        """Every party saves its final model; returns what each measured of its own exposure."""

    def close(self) -> None:
        """Release what the channel holds (links, workers)."""


class LocalChannel:
    """The channel with secondaries in the same process (no Flower): same party objects
    (app/vfl/secondary.py), direct calls. Used by tests and benchmarks to separate transport cost from compute.
    Gradient blocks and embeddings pass as tensors on the parties' devices (no host round trip)."""

    tensors = True
    traffic = None

    def __init__(self, parties: dict) -> None:
        self.parties = parties
        self.saved: dict[str, dict] = {}

    def step(
        self,
        apply: dict[str, list[GradBlock]],
        embed: dict[str, np.ndarray],
        save: tuple[str, int] | None = None,
        lr_scale: float = 1.0,
    ) -> dict[str, StepReply]:
        """Each party's step (SecondaryParty.step, as a node answers it); ``save`` = (the run's
        checkpoint folder, epoch): each party checkpoints into its own sub-folder."""
        folders, asked = _RunFolders(Path(save[0]) if save else None), ("", save[1]) if save else None
        replies = {}
        for p, tokens in embed.items():
            party = self.parties[p]
            req = StepRequest.build(apply[p], tokens, party.job_id, party.applied, lr_scale, asked)
            replies[p] = party.step(req, folders)
        if save is not None:
            self.saved = {p: r.state for p, r in replies.items()}
        return replies

    def send(
        self,
        apply: dict[str, list[GradBlock]],
        embed: dict[str, np.ndarray],
        save: tuple[str, int] | None = None,
        lr_scale: float = 1.0,
    ) -> dict[str, StepReply]:
        return self.step(apply, embed, save, lr_scale)  # in process the parties answer at once, in order

    def receive(self, request: dict[str, StepReply]) -> dict[str, StepReply]:
        return request

    def restore(self, folder: str, epoch: int) -> dict[str, dict]:
        return {
            p: {"digest": s.load_checkpoint(Path(folder) / p, epoch), "applied": s.applied}
            for p, s in self.parties.items()
        }

    @property
    def cursor(self) -> dict[str, int]:
        return {p: s.applied for p, s in self.parties.items()}

    def keep(self, run_dir: Path, epoch: int) -> None:
        """Nothing to send: in process the primary's keeper holds every party's state."""

    def flush_keep(self) -> None:
        """Nothing outstanding (see :meth:`keep`)."""

    def ping(self) -> float:
        return 0.0  # nothing travels between parties in one process

    def finish(self, folder: str) -> dict[str, dict]:
        return {}  # in process the primary measures the exposure of the parties it holds

    def close(self) -> None:
        """Nothing to release."""


class _RunFolders:
    """In process, a step's checkpoint goes into the run's checkpoint folder, one sub-folder per
    party; no keep travels (the primary's keeper holds every party's state)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    def keep(self, party, run: str, epoch: int, attempts: dict[str, str]) -> None:
        raise RuntimeError("in process the primary's keeper keeps the parties' states; no step asks a party to")

    def save(self, party, run: str, epoch: int) -> str:
        return party.save_checkpoint(self.folder / party.party, epoch)
