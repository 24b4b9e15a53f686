"""Python's cyclic garbage collector and a training loop.

A training step allocates thousands of small objects (autograd nodes, dicts, messages), so the
collector runs often, and its older generations' passes visit every object the process holds.
In a simulation's ServerApp process that is Flower's, Ray's and torch's millions of objects:
`perf` counted 84 % of that process's CPU in the collector during an Entity Augmentation epoch
(credit, 4 guests), and 34 % of each guest's party worker (docs/benchmarks.md "The garbage
collector in the simulation's step"). :func:`frozen_heap` leaves the objects alive when training
starts out of those passes (``gc.freeze``) until it ends (``gc.unfreeze``): the objects the
steps make are collected as before, nothing is computed differently, and nothing stays frozen
after the run (a process that trains many runs, a test worker, collects the old ones again).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0  # frozen_heap blocks open in this process: the outermost freezes and unfreezes


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Inside: the objects alive at entry are not visited by the collector's passes."""
    global _depth
    with _lock:
        _depth += 1
        if _depth == 1:
            gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.unfreeze()
