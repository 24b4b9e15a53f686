"""How a VFL run reaches its secondaries (app/vfl/server.py's driver runs every engine)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    """How a VFL run reaches its secondaries. ``name``: the run record's engine ("flower" |
    "inprocess"); ``tag``: its log lines' prefix; ``connect(ds, cfg, settings)`` -> (linkage, channel,
    linkage seconds, privacy report), all None / 0 for a method that links nothing. What the
    parties do (keep, finish, count traffic, close) is the channel's contract
    (strategies/vfl/channel.py); the engine says only whether the run is ``resumable``: over
    Flower every party checkpoints its state each epoch and the primary writes its best state as it
    goes, so an interrupted run resumes; in process nothing is checkpointed (a sweep resumes whole
    runs) and the primary keeps every party's best state until the run saves it."""

    name: str
    tag: str
    connect: Callable
    processes: int = 1  # processes of the run sharing this machine's CPUs (app/threads.py)

    @property
    def resumable(self) -> bool:
        return self.name == "flower"
