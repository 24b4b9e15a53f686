"""The primary's channel to the secondaries (the EA paper's host and guests) in Entity
Augmentation: one step's payloads, the contract Algorithm 1's exchange runs over, and the
in-process channel (every party an object in this process). Same shape as
strategies/vfl/channel.py; the Flower-backed channel is app/entity_aug/channel.py
(FlowerChannel), the queue with its timeout fallback strategies/entity_aug/exchange.py.
Shapes: B entities per step, c activation width of a party.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Protocol

import numpy as np

# ---------------------------------------------------------------------------- one exchange's payloads


@dataclass
class StepRequest:
    epoch: int
    step: int  # -1: apply the gradient only (end of epoch), no next batch
    grad: np.ndarray | None  # (B, c) gradient for the party's previous activation; None if it was not used fresh


@dataclass
class StepReply:
    ids: np.ndarray  # (B,) entity ids
    act: np.ndarray  # (B, c) activations


# ---------------------------------------------------------------------------- the contract


class SecondaryChannel(Protocol):
    parties: list[str]

    def send(self, party: str, request: StepRequest) -> None:
        """Start a step at the party; does not wait for the answer."""

    def collect(self, parties: set[str], until: float) -> dict[str, StepReply]:
        """Answers to these parties' outstanding requests that arrive before ``until``
        (time.monotonic()); returns as soon as all are in."""

    def embed(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Every party's activations (n, c_p) of these entities, waiting for all (evaluation)."""


class PartyLike(Protocol):
    """What the in-process channel calls on a party (strategies/entity_aug/model.py SecondaryParty)."""

    def step(self, req: StepRequest) -> StepReply: ...

    def embed(self, ids: np.ndarray) -> np.ndarray: ...


# ---------------------------------------------------------------------------- in process


class LocalChannel:
    """The channel with the parties in this process (no Flower). ``threaded``: each party
    answers on its own thread, so a slow party can miss the primary's timeout; otherwise each
    call runs to completion (deterministic)."""

    def __init__(self, parties: dict[str, PartyLike], threaded: bool = False) -> None:
        self.members = parties
        self.parties = sorted(parties)
        self._done: dict[str, StepReply] = {}
        self._futures: dict[str, Future] = {}
        self._pools = {p: ThreadPoolExecutor(max_workers=1) for p in parties} if threaded else {}

    def send(self, party: str, request: StepRequest) -> None:
        if self._pools:
            self._futures[party] = self._pools[party].submit(self.members[party].step, request)
        else:
            self._done[party] = self.members[party].step(request)

    def collect(self, parties: set[str], until: float) -> dict[str, StepReply]:
        out = {p: self._done.pop(p) for p in parties if p in self._done}
        waiting = {p: self._futures[p] for p in parties if p in self._futures}
        if waiting:
            wait_futures(list(waiting.values()), timeout=max(0.0, until - time.monotonic()))
            for p, fut in waiting.items():
                if fut.done():
                    out[p] = fut.result()
                    del self._futures[p]
        return out

    def embed(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        return {p: self.members[p].embed(ids) for p in self.parties}

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=True)
