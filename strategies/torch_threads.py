"""torch's intra-op threads for a block of small ops: set for the block, the process's count restored after.

Small models and small per-step bookkeeping split over threads wait at barriers more than they
gain, and where another process shares the cores (a simulation's other parties, other jobs) a
barrier waits for a descheduled thread. Measured: Entity Augmentation's few small Linears, one
epoch on a loaded 2-core machine 30 s with 2 threads against 0.5 s with 1; FedSim's exchange
observer (a (U, c) power iteration a step), in a hdb simulation at 2 threads 11 % of the primary's
samples, on one thread 1.3 % (py-spy on the ServerApp; docs/benchmarks.md)."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def torch_threads(n: int = 1):
    """torch's ops on ``n`` threads inside the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
