"""How a VFL run reaches its secondaries (app/vfl/server.py's driver runs every engine)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    """How a VFL run reaches its secondaries. ``name``: the run record's engine ("flower" |
    "inprocess"); ``tag``: its log lines' prefix; ``connect(ds, cfg, settings)`` -> (linkage, channel,
    linkage seconds, privacy report), all None / 0 for a method that links nothing. Over Flower
    (``remote``) each party keeps and checkpoints its own state and the channel counts traffic; in
    process the primary keeps every party's state and nothing is checkpointed (a sweep resumes
    whole runs)."""

    name: str
    tag: str
    connect: Callable
    processes: int = 1  # processes of the run sharing this machine's CPUs (app/threads.py)

    @property
    def remote(self) -> bool:
        return self.name == "flower"
