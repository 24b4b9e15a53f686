"""What a step says about itself, and the checks every reader applies, with no transport: the
Flower encoding (app/messages.py) and the direct transport carry these; the parties
(strategies/vfl/secondary.py, strategies/vfl/protocol.py) check them.

Changing what a step carries: its fields here (:class:`StepMeta`, :func:`step_digest`), the party
that reads them (strategies/vfl/secondary.py), the primary that writes them
(strategies/vfl/protocol.py) and their encoding (app/messages.py)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from strategies.vfl.exchange_checks import NonFiniteValues
from strategies.vfl.fedsim import GradBlock


class ProtocolError(ValueError):
    """A message with a field the protocol does not have (e.g. a path), or a name that is not plain."""


@dataclass(frozen=True)
class StepMeta:
    """What a step message says about itself, so a party can tell it is aligned with the primary:
    the linkage job its tokens belong to and how many gradient blocks the party must have applied
    before this one (the cursor) catch misalignment between the parties (another job, a lost,
    replayed or reordered message, a restore from another checkpoint); the digest of the job id,
    cursor and every token list catches a message altered or mixed up after it was built (TLS
    guards the wire itself)."""

    job_id: str
    cursor: int
    digest: str
    lr_scale: float = 1.0  # the learning rate of these blocks' updates, a fraction of the party's own (0, 1]


def step_digest(job_id: str, cursor: int, apply: list[GradBlock], tokens: np.ndarray, lr_scale: float = 1.0) -> str:
    h = hashlib.sha256(
        f"{job_id}|{cursor}|{len(apply)}|".encode() + (b"" if lr_scale == 1.0 else f"{lr_scale!r}|".encode())
    )
    for block in apply:
        h.update(np.ascontiguousarray(block.tokens, dtype=np.int64).tobytes())
        h.update(b"|")
    h.update(np.ascontiguousarray(tokens, dtype=np.int64).tobytes())
    return h.hexdigest()[:32]


def require_lr_scale(scale: float, where: str) -> float:
    """``scale`` if it is in (0, 1]: a schedule only lowers a party's own learning rate (NaN fails too)."""
    if not 0.0 < scale <= 1.0:
        raise ProtocolError(
            f"{where}: lr_scale must be in (0, 1] (a fraction of the party's own learning rate), got {scale}"
        )
    return scale


def require_finite(values, party: str, what: str, message: str) -> None:
    """Refuse a numpy array or torch tensor holding NaN or infinite values."""
    if hasattr(values, "isfinite"):  # torch
        bad, total = int((~values.isfinite()).sum()), values.numel()
    else:
        values = np.asarray(values)
        bad = int((~np.isfinite(values)).sum()) if values.dtype.kind in "fc" else 0
        total = values.size
    if bad:
        raise NonFiniteValues(
            f"party {party!r}: {what} in {message} has {bad} of {total} values non-finite "
            "(NaN or inf); refused, nothing applied"
        )
