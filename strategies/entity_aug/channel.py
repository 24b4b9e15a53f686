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

from strategies.wire_checks import ProtocolError, expect_fields, read_count, require_finite

# ---------------------------------------------------------------------------- one exchange's payloads


@dataclass
class StepRequest:
    """One step for a secondary, with its one codec to numpy arrays and plain scalars (Flower and
    the direct transport only wrap them: app/entity_aug/parties.py)."""

    epoch: int
    step: int  # -1: apply the gradient only (end of epoch), no next batch
    grad: np.ndarray | None  # (B, c) gradient for the party's previous activation; None if it was not used fresh

    def encode(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays = {} if self.grad is None else {"grad": np.ascontiguousarray(self.grad)}
        return arrays, {"epoch": int(self.epoch), "step": int(self.step), "has_grad": self.grad is not None}

    @classmethod
    def decode(cls, arrays: dict[str, np.ndarray], fields: dict) -> "StepRequest":
        """Refused unless exactly its fields and, when it says it has one, exactly its gradient;
        the party checks the gradient's values before applying them (strategies/entity_aug/secondary.py)."""
        expect_fields(fields, REQUEST_FIELDS, "train.ea_step")
        missing = sorted(REQUEST_FIELDS - set(fields))
        if missing:
            raise ProtocolError(f"train.ea_step: field(s) {missing} missing")
        if set(arrays) != ({"grad"} if fields["has_grad"] else set()):
            raise ProtocolError(f"train.ea_step: fields {sorted(fields)} with arrays {sorted(arrays)}")
        epoch, step = read_count(fields, "epoch", "train.ea_step"), read_count(fields, "step", "train.ea_step", low=-1)
        return cls(epoch, step, arrays.get("grad"))


REQUEST_FIELDS = {"epoch", "step", "has_grad"}


@dataclass
class StepReply:
    """A secondary's answer: the entities it embedded and their activations."""

    ids: np.ndarray  # (B,) entity ids
    act: np.ndarray  # (B, c) activations

    def encode(self) -> tuple[dict[str, np.ndarray], dict]:
        return {"ids": np.ascontiguousarray(self.ids, dtype=np.int64), "act": np.ascontiguousarray(self.act)}, {}

    @classmethod
    def decode(cls, arrays: dict[str, np.ndarray], fields: dict, party: str) -> "StepReply":
        """Refused naming ``party`` unless exactly ids (B,) of integers and finite activations (B, c)."""
        expect_fields(fields, set(), f"party {party!r}'s reply to train.ea_step")
        if set(arrays) != {"ids", "act"}:
            raise ProtocolError(f"party {party!r}'s reply to train.ea_step holds {sorted(arrays)}; expected ids, act")
        ids, act = arrays["ids"], arrays["act"]
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or act.ndim != 2 or len(act) != len(ids):
            raise ProtocolError(
                f"party {party!r}'s reply to train.ea_step: ids {ids.dtype} {ids.shape} for activations {act.shape}"
            )
        require_finite(act, party, "activations", "the reply to train.ea_step")
        return cls(ids, act)


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
