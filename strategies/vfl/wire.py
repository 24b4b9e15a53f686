"""A step as it travels between the primary and one secondary, and the checks every reader
applies, with no transport: :class:`StepRequest` (what the primary sends) and :class:`StepReply`
(what the secondary answers), each with its one codec to numpy arrays and plain scalars
(``encode`` / ``decode``). Flower (app/messages.py) and the direct transport only wrap those
two dicts in records; the parties (strategies/vfl/secondary.py ``step``, strategies/vfl/protocol.py)
build and read the types.

Changing what a secondary sends per step: a field of :class:`StepReply` and its codec here, the
party that fills it (strategies/vfl/secondary.py), the primary that reads it (strategies/vfl/protocol.py)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from strategies.wire_checks import (
    ProtocolError,
    expect_fields,
    plain_name,
    read_count,
    read_number,
    read_text,
    require_finite,
)

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class GradBlock:
    """The gradient of one step's loss w.r.t. the embeddings of exactly these tokens."""

    tokens: np.ndarray  # (U,) int64
    grad: np.ndarray | torch.Tensor  # (U, c) float: a device tensor from the step, a host array off a transport


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


# ---------------------------------------------------------------------------- the step's two messages

STEP_FIELDS = {"n_apply", "job_id", "cursor", "digest", "lr_scale", "save_run", "save_epoch", "keep_run", "keep_epoch"}
STEP_FIELDS |= {"keep_attempt", "keep_previous"}  # the attempts whose kept states stay (app/kept.py kept_attempts)
STATE_FIELDS = {"state_digest", "state_applied", "state_epoch"}  # the checkpoint a step saved, if it saved
REPLY_FIELDS = STATE_FIELDS | {"applied"}


@dataclass(frozen=True)
class StepRequest:
    """One secondary's step: its gradient blocks to apply (in order, at ``lr_scale`` of its learning
    rate), then its tokens to embed; ``keep`` = (run, epoch, attempt, previous): first keep the current state
    (the one the epoch's evaluation embedded with) as its model for the run's training attempt; ``save`` = (run, epoch):
    checkpoint between applying and embedding. ``job_id``, ``cursor`` and ``digest`` let the party
    tell the step is aligned with it (:class:`StepMeta`); build with :meth:`build`."""

    apply: list[GradBlock]
    tokens: np.ndarray  # (U,)
    job_id: str = ""
    cursor: int = 0
    digest: str = ""
    lr_scale: float = 1.0
    save: tuple[str, int] | None = None
    keep: tuple[str, int, str, str] | None = None  # previous: "" when none

    @classmethod
    def build(cls, apply, tokens, job_id="", cursor=0, lr_scale=1.0, save=None, keep=None) -> "StepRequest":
        """The request with its digest (:func:`step_digest`) computed over what it carries."""
        digest = step_digest(job_id, cursor, apply, tokens, lr_scale)
        return cls(list(apply), tokens, job_id, cursor, digest, lr_scale, save, keep)

    @property
    def meta(self) -> StepMeta:
        return StepMeta(self.job_id, self.cursor, self.digest, self.lr_scale)

    def encode(self) -> tuple[dict[str, np.ndarray], dict]:
        """(arrays, scalars): tokens and each block's tokens and gradient; the rest as plain values."""
        arrays = {"tokens": np.ascontiguousarray(self.tokens, dtype=np.int64)}
        for j, block in enumerate(self.apply):
            arrays[f"apply_tokens_{j}"] = np.ascontiguousarray(block.tokens, dtype=np.int64)
            arrays[f"apply_grad_{j}"] = np.ascontiguousarray(block.grad)
        fields = {"n_apply": len(self.apply), "job_id": self.job_id, "cursor": self.cursor, "digest": self.digest}
        if self.lr_scale != 1.0:
            fields["lr_scale"] = float(self.lr_scale)
        for name, asked in (("save", self.save), ("keep", self.keep)):
            if asked is not None:
                fields.update({f"{name}_run": asked[0], f"{name}_epoch": int(asked[1])})
        if self.keep is not None:
            fields["keep_attempt"] = self.keep[2]
            if self.keep[3]:
                fields["keep_previous"] = self.keep[3]
        return arrays, fields

    @classmethod
    def decode(cls, arrays: dict[str, np.ndarray], fields: dict) -> "StepRequest":
        """The request, every field checked (none the protocol lacks, the block count the arrays
        hold, names plain, lr_scale in (0, 1]); the party checks the blocks' values before it
        applies any (strategies/vfl/secondary.py)."""
        expect_fields(fields, STEP_FIELDS, "train.step")
        n = read_count(fields, "n_apply", "train.step")
        if len(arrays) != 2 * n + 1:  # before naming any: n_apply is the sender's number
            raise ProtocolError(f"train.step: n_apply = {n} but the step holds {len(arrays)} arrays (expected 2 n + 1)")
        want = {"tokens"} | {f"apply_{f}_{j}" for j in range(n) for f in ("tokens", "grad")}
        if set(arrays) != want:
            raise ProtocolError(
                f"train.step: its arrays are not 'tokens' and apply_tokens_j / apply_grad_j for j < {n}"
            )
        blocks = [GradBlock(arrays[f"apply_tokens_{j}"], arrays[f"apply_grad_{j}"]) for j in range(n)]
        scale = require_lr_scale(
            read_number(fields, "lr_scale", "train.step") if "lr_scale" in fields else 1.0, "train.step"
        )
        asked = {name: _asked(fields, name) for name in ("save", "keep")}
        if asked["keep"] is not None:  # the finished run the attempt would replace, if any
            previous = fields.get("keep_previous")
            asked["keep"] += ("" if previous is None else plain_name(previous, "keep_previous", "train.step"),)
        job, digest = read_text(fields, "job_id", "train.step"), read_text(fields, "digest", "train.step")
        cursor = read_count(fields, "cursor", "train.step")
        return cls(blocks, arrays["tokens"], job, cursor, digest, scale, asked["save"], asked["keep"])


ASKED = {"save": ("run", "epoch"), "keep": ("run", "epoch", "attempt")}  # a step's save and keep, each whole


def _asked(fields: dict, name: str) -> tuple | None:
    """A step's ``name`` ("save" or "keep": its fields in ASKED, plain names and an epoch), None
    when it carries none of them; refused naming what it lacks when it carries part."""
    keys = [f"{name}_{part}" for part in ASKED[name]]
    present = [k for k in keys if k in fields]
    if not present:
        return None
    if len(present) != len(keys):
        raise ProtocolError(f"train.step: a {name} needs {keys}; it lacks {sorted(set(keys) - set(present))}")

    def read(k: str):
        return read_count(fields, k, "train.step") if k.endswith("_epoch") else plain_name(fields[k], k, "train.step")

    return tuple(map(read, keys))


@dataclass(frozen=True)
class StepReply:
    """A secondary's answer: the embeddings (U, c) of the tokens asked (a host array, or a tensor
    in process); when the step saved a checkpoint, its ``state`` {"digest", "applied", "epoch"};
    ``applied``, the gradient blocks it has applied after the step (None: not a step's reply),
    which the primary compares with what it sent (strategies/vfl/protocol.py checked)."""

    emb: object  # (U, c) np.ndarray or torch.Tensor
    state: dict | None = None
    applied: int | None = None

    def encode(self) -> tuple[dict[str, np.ndarray], dict]:
        emb = self.emb.detach().cpu().numpy() if hasattr(self.emb, "detach") else self.emb
        fields = {} if self.state is None else {f"state_{k}": v for k, v in self.state.items()}
        if self.applied is not None:
            fields["applied"] = int(self.applied)
        return {"emb": np.ascontiguousarray(emb)}, fields

    @classmethod
    def decode(cls, arrays: dict[str, np.ndarray], fields: dict, party: str, message: str) -> "StepReply":
        """The reply, refused naming ``party`` when it holds other arrays or fields or non-finite
        embeddings; their shape and dtype are checked by the primary against what it asked
        (strategies/wire_checks.py)."""
        if set(arrays) != {"emb"}:
            raise ProtocolError(
                f"party {party!r}'s reply to {message} holds arrays {sorted(arrays)}; expected 'emb' only"
            )
        who = f"party {party!r}'s reply to {message}"
        expect_fields(fields, REPLY_FIELDS, who)
        require_finite(arrays["emb"], party, "embeddings", f"the reply to {message}")
        state = None
        if set(fields) & STATE_FIELDS:
            if not STATE_FIELDS <= set(fields):
                raise ProtocolError(f"party {party!r}'s reply to {message}: a saved state needs {sorted(STATE_FIELDS)}")
            state = {
                "digest": read_text(fields, "state_digest", who),
                "applied": read_count(fields, "state_applied", who),
            }
            state["epoch"] = read_count(fields, "state_epoch", who)
        applied = read_count(fields, "applied", who) if "applied" in fields else None
        return cls(arrays["emb"], state, applied)
