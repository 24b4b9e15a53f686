"""Probes: benchmark and fault-injection knobs that are not part of a product run's config.

They are read from the environment of the process that uses them (a Flower simulation passes its
environment on to the ServerApp and the ClientApps), so a deployment's run config cannot carry
them and ``fedsim train`` never shows them. A value that is not a non-negative number is refused by
the variable's name.

- ``FEDSIM_PROBE_BENCH_FLOOR`` (int): the primary times this many empty exchanges before training
  (bench/sim_cost.py: Flower's own cost per message).
- ``FEDSIM_PROBE_SECONDARY_DELAY`` (float seconds): in Entity Augmentation the first secondary sleeps
  this long on odd steps (tests of ``secondary-timeout``).
"""

from __future__ import annotations

import os

BENCH_FLOOR = "FEDSIM_PROBE_BENCH_FLOOR"
SECONDARY_DELAY = "FEDSIM_PROBE_SECONDARY_DELAY"


def _read(name: str, kind: type) -> int | float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return kind(0)
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a non-negative {kind.__name__}") from None
    if not value >= 0:
        raise ValueError(f"{name}={raw!r}: expected a non-negative {kind.__name__}")
    return value


def bench_floor() -> int:
    """Empty exchanges to time before training (0: none)."""
    return int(_read(BENCH_FLOOR, int))


def secondary_delay() -> float:
    """Seconds the first Entity Augmentation secondary sleeps on odd steps (0: none)."""
    return float(_read(SECONDARY_DELAY, float))
