"""Entity Augmentation's exchange between the primary and the secondaries (the EA paper's host
and guests; Algorithm 1): the per-party queue with its timeout fallback, over any
:class:`~strategies.entity_aug.channel.SecondaryChannel` (in process: LocalChannel; over Flower:
``app.entity_aug.channel.FlowerChannel``). Shapes: B entities per step, c activation width of a party.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from strategies.entity_aug.channel import SecondaryChannel, StepReply, StepRequest


class SecondaryTimeout(RuntimeError):
    """A secondary never answered, so there is no last activation to fall back on."""


# ---------------------------------------------------------------------------- the queue


class SecondaryQueue:
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
            raise SecondaryTimeout(f"party {never[0]!r} has sent no activation yet: nothing to fall back on")
        for p in self.parties:
            if p not in self.fresh:
                self.stale[p] += 1
        fresh, self.fresh = self.fresh, set()
        return dict(self.last), fresh


class Exchanger:
    """Runs the steps over a channel with the queue's fallback. A party still busy with an
    earlier request gets no new one (it would run twice at once); its late answer, when it
    comes, is the freshest activation of that party. Gradients go only to parties whose
    activation was fresh in the step (a stale one's gradient is dropped)."""

    def __init__(self, channel: SecondaryChannel, timeout: float, patience: float) -> None:
        """timeout: seconds to wait for a party that has an activation to fall back on (0 = no
        fallback: every party must answer within ``patience``); patience: the longest wait for
        any answer before the run fails (SecondaryTimeout)."""
        self.channel, self.timeout, self.patience = channel, timeout, patience
        self.queue = SecondaryQueue(channel.parties)
        self.outstanding: set[str] = set()
        self.exchanges = 0
        self._sent_at = 0.0  # time.monotonic() of the last send

    def _receive(self, replies: dict[str, StepReply]) -> None:
        for p, reply in replies.items():
            self.outstanding.discard(p)
            self.queue.put(p, reply)

    def step(self, epoch: int, step: int, grads: dict[str, np.ndarray]) -> tuple[dict[str, StepReply], set[str]]:
        """:meth:`send`, then :meth:`receive`: the activations of the step (and which are fresh)."""
        self.send(epoch, step, grads)
        return self.receive(step)

    def send(self, epoch: int, step: int, grads: dict[str, np.ndarray]) -> None:
        """Ask every party not still busy for its step, with its gradient of the last one; the
        deadline of :meth:`receive` counts from here."""
        for p in self.channel.parties:
            if p not in self.outstanding:
                self.channel.send(p, StepRequest(epoch, step, grads.get(p)))
                self.outstanding.add(p)
        self.exchanges += 1
        self._sent_at = time.monotonic()

    def receive(self, step: int) -> tuple[dict[str, StepReply], set[str]]:
        """The step's activations: the answers in by the deadline, a late party's last one (queue)."""
        t0 = self._sent_at
        self._receive(self.channel.collect(set(self.outstanding), t0 + (self.timeout or self.patience)))
        # without a timeout every party must answer; with one, those with nothing to fall back on yet
        must = {p for p in self.outstanding if not self.timeout or p not in self.queue.last}
        if must:
            self._receive(self.channel.collect(must, t0 + self.patience))
            missing = sorted(p for p in must if p in self.outstanding)
            if missing:
                what = "its first step" if missing[0] not in self.queue.last else f"step {step} (no timeout fallback)"
                raise SecondaryTimeout(f"party {missing[0]!r} did not answer {what} within {self.patience} s")
        return self.queue.take()

    def flush(self, epoch: int, grads: dict[str, np.ndarray]) -> None:
        """End of an epoch: wait out late answers (too late to train on; dropped), then hand
        every party its last gradient (or none) so that all are settled before evaluation."""
        late = self._wait_all(set(self.outstanding), "its late step")
        for p in self.channel.parties:
            self.channel.send(p, StepRequest(epoch, -1, None if p in late else grads.get(p)))
        self._wait_all(set(self.channel.parties), "the end of the epoch")
        self.exchanges += 1

    def _wait_all(self, parties: set[str], what: str) -> set[str]:
        got = self.channel.collect(parties, time.monotonic() + self.patience) if parties else {}
        if set(got) != parties:
            raise SecondaryTimeout(
                f"party {sorted(parties - set(got))[0]!r} did not answer {what} within {self.patience} s"
            )
        self.outstanding -= parties
        return set(got)
