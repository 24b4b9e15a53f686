"""The WAN relay's settings (lab/wan_relay.py): one direction of the emulated path (``Link``),
the relay's whole configuration (``RelaySettings``, each field checked by name), and the
``Schedule`` that says when each chunk of one direction is released (pure, given the read times,
so a test checks it without a clock)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

JITTERS = ("uniform", "normal")
LINK_FLAGS = {"delay-ms": "one-way delay", "jitter-ms": "the bound of the jitter", "rate-mbit": "cap, Mbit/s; 0: none"}


def _check(settings, names: tuple[str, ...], ok: Callable[[object], bool], what: str) -> None:
    for name in names:
        if not ok(value := getattr(settings, name)):
            raise ValueError(f"{name} must be {what}, not {value!r}")


@dataclass(frozen=True)
class Link:
    """One direction of the emulated path."""

    delay_ms: float = 0.0  # one-way
    jitter_ms: float = 0.0  # the bound of the jitter added to the delay
    rate_mbit: float = 0.0  # the cap, Mbit/s of payload; 0 = unlimited
    jitter: str = "uniform"  # or "normal" (sigma jitter_ms / 2, clipped to +-jitter_ms)

    def __post_init__(self):
        _check(self, ("delay_ms", "jitter_ms", "rate_mbit"), lambda x: 0 <= x < float("inf"), "finite, >= 0")
        _check(self, ("jitter",), lambda x: x in JITTERS, f"one of {JITTERS}")


@dataclass(frozen=True)
class RelaySettings:
    target_port: int
    target_host: str = "127.0.0.1"
    listen_host: str = "127.0.0.1"
    listen_port: int = 0  # 0: any free port (RelayHandle.port says which)
    up: Link = field(default_factory=Link)  # client -> target
    down: Link = field(default_factory=Link)  # target -> client
    lifetime_s: float = 3600.0  # then the relay closes everything and exits
    idle_timeout_s: float = 600.0  # a connection with no byte either way for this long is closed
    max_connections: int = 64
    max_queued_bytes: int = 4 << 20  # per direction of a connection; past it the relay stops reading
    chunk_bytes: int = 64 << 10  # the most one read takes (the unit of delay)
    connect_timeout_s: float = 10.0
    seed: int = 0

    def __post_init__(self):
        _check(self, ("target_port", "listen_port"), lambda x: 0 <= x <= 65535, "in 0-65535")
        sizes = ("lifetime_s", "idle_timeout_s", "max_connections", "max_queued_bytes", "chunk_bytes")
        _check(self, (*sizes, "connect_timeout_s"), lambda x: x > 0, "> 0")


class Schedule:
    """When each chunk of one direction is released (see the module's docstring); pure, given the
    read times, so a test can check it without a clock."""

    def __init__(self, link: Link, rng: random.Random):
        self.link, self.rng = link, rng
        self.sent = self.last = float("-inf")  # the end of the emulated sending; the previous release

    def jitter_s(self) -> float:
        bound = self.link.jitter_ms / 1000
        if self.link.jitter == "normal":
            return min(bound, max(-bound, self.rng.gauss(0.0, bound / 2)))
        return self.rng.uniform(-bound, bound)

    def release(self, now: float, nbytes: int) -> float:
        rate = self.link.rate_mbit * 1e6
        self.sent = max(now, self.sent) + (nbytes * 8 / rate if rate > 0 else 0.0)
        arrival = self.sent + max(0.0, self.link.delay_ms / 1000 + self.jitter_s())
        self.last = max(self.last, arrival)
        return self.last
