"""Entity augmentation's exchange between the host and its parties (Algorithm 1): one step's
payloads, the link protocol to the parties, the per-party queue with its timeout fallback, and
the in-process link. Transport-independent: a Flower link is ``app.entity_aug.channel.FlowerLink``.
Shapes: B entities per step, c activation width of a party.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class GuestTimeout(RuntimeError):
    """A party never answered, so there is no last activation to fall back on."""


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


# ---------------------------------------------------------------------------- transport and queue


class GuestLink(Protocol):
    parties: list[str]

    def send(self, party: str, request: StepRequest) -> None:
        """Start a step at the party; does not wait for the answer."""

    def collect(self, parties: set[str], until: float) -> dict[str, StepReply]:
        """Answers to these parties' outstanding requests that arrive before ``until``
        (time.monotonic()); returns as soon as all are in."""

    def embed(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Every party's activations (n, c_p) of these entities, waiting for all (evaluation)."""


class GuestQueue:
    """Algorithm 1's queues: the last activation and ids received from each party. ``take``
    returns them for a step; a party with no new answer since the last ``take`` is represented
    by its last one and counted in ``stale``."""

    def __init__(self, parties: Sequence[str]) -> None:
        self.parties = list(parties)
        self.last: dict[str, StepReply] = {}
        self.stale = {p: 0 for p in self.parties}
        self.fresh: set[str] = set()

    def put(self, party: str, reply: StepReply) -> None:
        self.last[party] = reply
        self.fresh.add(party)

    def take(self) -> tuple[dict[str, StepReply], set[str]]:
        never = [p for p in self.parties if p not in self.last]
        if never:
            raise GuestTimeout(f"party {never[0]!r} has sent no activation yet: nothing to fall back on")
        for p in self.parties:
            if p not in self.fresh:
                self.stale[p] += 1
        fresh, self.fresh = self.fresh, set()
        return dict(self.last), fresh


class Exchanger:
    """Runs the steps over a link with the queue's fallback. A party still busy with an
    earlier request gets no new one (it would run twice at once); its late answer, when it
    comes, is the freshest activation of that party. Gradients go only to parties whose
    activation was fresh in the step (a stale one's gradient is dropped)."""

    def __init__(self, link: GuestLink, timeout: float, patience: float) -> None:
        """timeout: seconds to wait for a party that has an activation to fall back on (0 = no
        fallback: every party must answer within ``patience``); patience: the longest wait for
        any answer before the run fails (GuestTimeout)."""
        self.link, self.timeout, self.patience = link, timeout, patience
        self.queue = GuestQueue(link.parties)
        self.outstanding: set[str] = set()
        self.exchanges = 0

    def _receive(self, replies: dict[str, StepReply]) -> None:
        for p, reply in replies.items():
            self.outstanding.discard(p)
            self.queue.put(p, reply)

    def step(self, epoch: int, step: int, grads: dict[str, np.ndarray]) -> tuple[dict[str, StepReply], set[str]]:
        for p in self.link.parties:
            if p not in self.outstanding:
                self.link.send(p, StepRequest(epoch, step, grads.get(p)))
                self.outstanding.add(p)
        self.exchanges += 1
        t0 = time.monotonic()
        self._receive(self.link.collect(set(self.outstanding), t0 + (self.timeout or self.patience)))
        # without a timeout every party must answer; with one, those with nothing to fall back on yet
        must = {p for p in self.outstanding if not self.timeout or p not in self.queue.last}
        if must:
            self._receive(self.link.collect(must, t0 + self.patience))
            missing = sorted(p for p in must if p in self.outstanding)
            if missing:
                what = "its first step" if missing[0] not in self.queue.last else f"step {step} (no timeout fallback)"
                raise GuestTimeout(f"party {missing[0]!r} did not answer {what} within {self.patience} s")
        return self.queue.take()

    def flush(self, epoch: int, grads: dict[str, np.ndarray]) -> None:
        """End of an epoch: wait out late answers (too late to train on; dropped), then hand
        every party its last gradient (or none) so that all are settled before evaluation."""
        late = self._wait_all(set(self.outstanding), "its late step")
        for p in self.link.parties:
            self.link.send(p, StepRequest(epoch, -1, None if p in late else grads.get(p)))
        self._wait_all(set(self.link.parties), "the end of the epoch")
        self.exchanges += 1

    def _wait_all(self, parties: set[str], what: str) -> set[str]:
        got = self.link.collect(parties, time.monotonic() + self.patience) if parties else {}
        if set(got) != parties:
            raise GuestTimeout(f"party {sorted(parties - set(got))[0]!r} did not answer {what} within {self.patience} s")
        self.outstanding -= parties
        return set(got)


class PartyLike(Protocol):
    def step(self, req: StepRequest) -> StepReply: ...

    def embed(self, ids: np.ndarray) -> np.ndarray: ...


class LocalLink:
    """Parties in this process. ``threaded``: each party answers on its own thread, so a slow
    party can miss the host's timeout; otherwise each call runs to completion (deterministic)."""

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
