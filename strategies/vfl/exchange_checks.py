"""What a party accepts of another party's tensors: exactly the shape it asked for, in its own
compute dtype, finite, and within a bound it states. A refusal names the sender, the message and
the field, what was expected and what came; nothing is applied before every block is checked.

    check_block(values, Expect(sender, what, message, shape, dtype)) -> values (numpy, unchanged)
    check_losses(losses (n,), first_step) -> raises TrainingDiverged at the first non-finite loss

Why a bound and not only finiteness: a value that is finite as sent can still poison the
receiver's arithmetic (3.4e38, float32's largest, squared or summed over K x c products is inf,
and then every weight NaN). EXCHANGE_BOUND = 1e6: honest embeddings and cut-layer gradients are
O(1) to O(100) (a party's MLP output; the gradient of a batch-mean loss), so 1e6 refuses nothing
honest, while 1e6 summed over K = 1000 neighbours of c = 1000 products with weights of 1e3 is
1e15, squared 1e30, under float32's 3.4e38: no sum or square of accepted values overflows.

Tensors an in-process channel hands over (one process, no other party) are not checked here:
only arrays that crossed a process boundary (Flower messages, the direct transport).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from strategies.wire_checks import NonFiniteValues, PeerValueError  # noqa: F401 - re-exported: the refusals

if TYPE_CHECKING:
    import torch

EXCHANGE_BOUND = 1e6  # the largest |value| accepted in an exchanged embedding or gradient (module docstring)


class TrainingDiverged(RuntimeError):
    """The primary's own loss became non-finite although every party's inputs were accepted."""


@dataclass(frozen=True)
class Expect:
    """What a receiver asked for: from ``sender`` ("party 'school'", "the primary"), field
    ``what`` of ``message``, of ``shape`` in ``dtype`` (the receiver's compute dtype)."""

    sender: str
    what: str
    message: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    receiver: str = ""  # the receiving party's name; "" = the primary
    bound: float = EXCHANGE_BOUND

    def refuse(self, why: str, kind: type = PeerValueError) -> PeerValueError:
        who = f"party {self.receiver!r}" if self.receiver else "the primary"
        return kind(f"{who}: {self.what} from {self.sender} in {self.message}: {why}; refused, nothing applied")


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    import torch  # lazy: a torch dtype was given, so torch is loaded; the wire's readers need none (handshakes)

    return torch.empty((), dtype=dtype).numpy().dtype


def check_block(values, expect: Expect):
    """``values`` if it is a numpy array of exactly ``expect``'s shape and dtype whose values are
    finite and within the bound; a torch tensor (an in-process channel's) is returned as it is."""
    torch = sys.modules.get("torch")  # not imported: ``values`` cannot be a tensor
    if torch is not None and isinstance(values, torch.Tensor):
        return values
    if not isinstance(values, np.ndarray):
        raise expect.refuse(f"expected an array, got {type(values).__name__}")
    want = numpy_dtype(expect.dtype)
    if values.dtype != want:
        raise expect.refuse(f"dtype {values.dtype}, expected {want} (the receiver's compute dtype; no conversion)")
    if values.shape != tuple(expect.shape):
        raise expect.refuse(f"shape {values.shape}, expected {tuple(expect.shape)}")
    if values.size:
        finite = np.isfinite(values)
        if not finite.all():
            raise expect.refuse(
                f"{int((~finite).sum())} of {values.size} values non-finite (NaN or inf)", NonFiniteValues
            )
        top = float(np.abs(values).max())
        if top > expect.bound:
            raise expect.refuse(f"a value of magnitude {top:.3g}, over the receiver's bound {expect.bound:g}")
    return values


def check_losses(losses: list[float], first_step: int) -> None:
    """Refuse a run whose loss stopped being finite (every input having passed check_block)."""
    bad = next((i for i, v in enumerate(losses) if not np.isfinite(v)), None)
    if bad is not None:
        raise TrainingDiverged(
            f"the primary's training loss is {losses[bad]} at step {first_step + bad + 1}, with every party's "
            "embeddings finite and within the bound: training diverged (lower lr, or check the inputs)"
        )
