"""The primary's channel to the secondaries: the contract the protocol trains through, and the
in-process channel (every party an object in this process). The Flower-backed channel is
app/vfl/channel.py; Entity Augmentation's alike pieces are in strategies/entity_aug/channel.py."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from strategies.vfl.fedsim import GradBlock


class SecondaryChannel(Protocol):
    saved: dict[str, dict]  # per party {"digest", "applied"} of the last checkpoint a step saved

    def step(
        self, apply: dict[str, list[GradBlock]], embed: dict[str, np.ndarray], save: tuple[str, int] | None = None
    ) -> dict[str, np.ndarray]:
        """Apply the gradient blocks in order, then (``save`` = (folder, epoch)) checkpoint, then
        return embeddings (U, c) of the tokens (U,)."""

    def send(self, apply: dict[str, list[GradBlock]], embed: dict[str, np.ndarray]) -> object:
        """:meth:`step` without waiting: returns a request for :meth:`receive`. At most one is
        outstanding; the parties handle requests in the order they are sent."""

    def receive(self, request: object) -> dict[str, np.ndarray]:
        """The embeddings a :meth:`send` asked for."""


class LocalChannel:
    """The channel with secondaries in the same process (no Flower): same party objects
    (app/vfl/secondary.py), direct calls. Used by tests and benchmarks to separate transport cost from compute."""

    def __init__(self, parties: dict) -> None:
        self.parties = parties
        self.saved: dict[str, dict] = {}

    def step(
        self, apply: dict[str, list[GradBlock]], embed: dict[str, np.ndarray], save: tuple[str, int] | None = None
    ) -> dict[str, np.ndarray]:
        for p, blocks in apply.items():
            self.parties[p].apply(blocks)
        if save is not None:
            folder, epoch = save
            self.saved = {
                p: {"digest": s.save_checkpoint(Path(folder) / p, epoch), "applied": s.applied, "epoch": epoch}
                for p, s in self.parties.items()
            }
        return {p: self.parties[p].embed(t) for p, t in embed.items()}

    def send(self, apply: dict[str, list[GradBlock]], embed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.step(apply, embed)  # in process the parties answer at once, in order

    def receive(self, request: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return request

    def restore(self, folder: str, epoch: int) -> dict[str, dict]:
        return {
            p: {"digest": s.load_checkpoint(Path(folder) / p, epoch), "applied": s.applied}
            for p, s in self.parties.items()
        }
