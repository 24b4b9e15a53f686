"""FedSim's primary's last check on its own training: its loss must stay finite, every party's
tensors having passed the exchange's checks (strategies/wire_checks.py: exact shape and dtype,
finite, within the bound).

    check_losses(losses (n,), first_step) -> raises TrainingDiverged at the first non-finite loss
"""

from __future__ import annotations

import numpy as np


class TrainingDiverged(RuntimeError):
    """The primary's own loss became non-finite although every party's inputs were accepted."""


def check_losses(losses: list[float], first_step: int) -> None:
    """Refuse a run whose loss stopped being finite (every input having passed check_block)."""
    bad = next((i for i, v in enumerate(losses) if not np.isfinite(v)), None)
    if bad is not None:
        raise TrainingDiverged(
            f"the primary's training loss is {losses[bad]} at step {first_step + bad + 1}, with every party's "
            "embeddings finite and within the bound: training diverged (lower lr, or check the inputs)"
        )
