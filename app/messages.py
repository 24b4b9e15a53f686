"""Wire format of the protocol's messages over Flower: numpy arrays in ArrayRecords, scalars in
ConfigRecords (what a step says, and the checks on it, are strategies/vfl/wire.py's).

No message names a path: a party reads and writes only under its own configured folders
(app/node.py); a message may name a run or a linkage job, each one plain folder name. Every
reader refuses a field it does not know and a non-finite tensor, naming the party and message."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from strategies.vfl.exchange_checks import NonFiniteValues  # noqa: F401 - re-exported: the readers' refusal
from strategies.vfl.fedsim import GradBlock
from strategies.vfl.wire import ProtocolError, StepMeta, require_finite, require_lr_scale, step_digest


def flower(handler: Callable[[RecordDict, Context], RecordDict]) -> Callable[[Message, Context], Message]:
    """A content handler, (RecordDict, Context) -> RecordDict, as a ClientApp handler: its reply
    goes back through Flower; the direct transport's party worker calls the content handler itself."""

    @functools.wraps(handler)
    def on_message(msg: Message, context: Context) -> Message:
        return Message(handler(msg.content, context), reply_to=msg)

    return on_message


PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=,@-]{0,127}")
STEP_FIELDS = {"n_apply", "job_id", "cursor", "digest", "lr_scale", "save_run", "save_epoch", "keep_run", "keep_epoch"}


def plain_name(value: object, what: str, message: str) -> str:
    """``value`` if it is one plain folder name (no separator, not '.' or '..', no leading dot or dash)."""
    name = str(value)
    if not PLAIN_NAME.fullmatch(name) or ".." in name:
        raise ProtocolError(
            f"{message}: refusing {what} {name!r}: it must be one plain folder name "
            "(letters, digits, _ . + = , @ -; no path)"
        )
    return name


def expect_fields(record, allowed: set[str], message: str) -> None:
    """Refuse fields the protocol does not define (a primary must not steer a party's paths)."""
    unknown = sorted(set(record) - allowed)
    if unknown:
        raise ProtocolError(
            f"{message} carries field(s) {unknown} that the protocol does not have (expected "
            f"{sorted(allowed)}); a party reads and writes only under its own configured folders"
        )


def step_content(
    apply: list[GradBlock],
    tokens: np.ndarray,
    job_id: str = "",
    cursor: int = 0,
    save: tuple[str, int] | None = None,
    keep: tuple[str, int] | None = None,
    lr_scale: float = 1.0,
) -> RecordDict:
    """A step: gradient blocks to apply (``lr_scale``: at that fraction of the party's learning
    rate, the primary's schedule: strategies/records.py lr_scale), then tokens to embed; ``save``
    = (run name, epoch) asks the party to checkpoint between the two (into its own folder for that run); ``keep`` =
    (run name, epoch) asks it first to keep its current state (the one the epoch's evaluation
    embedded with, at ``cursor`` blocks) as its model for the run (app/vfl/channel.py:keep)."""
    arrays = {"tokens": Array(np.ascontiguousarray(tokens, dtype=np.int64))}
    for j, block in enumerate(apply):
        arrays[f"apply_tokens_{j}"] = Array(np.ascontiguousarray(block.tokens, dtype=np.int64))
        arrays[f"apply_grad_{j}"] = Array(np.ascontiguousarray(block.grad))
    meta = {
        "n_apply": len(apply),
        "job_id": job_id,
        "cursor": cursor,
        "digest": step_digest(job_id, cursor, apply, tokens, lr_scale),
    }
    if lr_scale != 1.0:
        meta["lr_scale"] = float(lr_scale)
    if save is not None:
        meta.update(save_run=save[0], save_epoch=save[1])
    if keep is not None:
        meta.update(keep_run=keep[0], keep_epoch=keep[1])
    return RecordDict({"step": ArrayRecord(arrays), "meta": ConfigRecord(meta)})


def read_save(content: RecordDict) -> tuple[str, int] | None:
    """(run name, epoch) of a step that asks for a checkpoint, else None."""
    return _run_epoch(content, "save")


def read_keep(content: RecordDict) -> tuple[str, int] | None:
    """(run name, epoch) of a step that asks the party to keep its state first, else None."""
    return _run_epoch(content, "keep")


def _run_epoch(content: RecordDict, prefix: str) -> tuple[str, int] | None:
    """A step's optional (``<prefix>_run``, ``<prefix>_epoch``) request, checked."""
    meta = content.config_records["meta"]
    expect_fields(meta, STEP_FIELDS, "train.step")
    if f"{prefix}_epoch" not in meta:
        return None
    return plain_name(meta[f"{prefix}_run"], "run name", "train.step"), int(meta[f"{prefix}_epoch"])


def read_step(content: RecordDict) -> tuple[list[GradBlock], np.ndarray, StepMeta]:
    """The step's gradient blocks, tokens to embed and meta. The party checks the blocks (finite
    in its own dtype, shapes, tokens) before it applies any (app/vfl/secondary.py:apply)."""
    if "step" not in content.array_records or "meta" not in content.config_records:
        raise ProtocolError("train.step lacks its 'step' arrays or its 'meta' record")
    arrays = content.array_records["step"]
    meta = content.config_records["meta"]
    expect_fields(meta, STEP_FIELDS, "train.step")
    n = int(meta["n_apply"])
    if n < 0 or len(arrays) != 2 * n + 1:  # before naming any: n_apply is the sender's number
        raise ProtocolError(f"train.step: n_apply = {n} but the step holds {len(arrays)} arrays (expected 2 n + 1)")
    want = {"tokens"} | {f"apply_{f}_{j}" for j in range(n) for f in ("tokens", "grad")}
    if set(arrays) != want:
        raise ProtocolError(f"train.step: its arrays are not 'tokens' and apply_tokens_j / apply_grad_j for j < {n}")
    blocks = [GradBlock(arrays[f"apply_tokens_{j}"].numpy(), arrays[f"apply_grad_{j}"].numpy()) for j in range(n)]
    scale = require_lr_scale(float(meta.get("lr_scale", 1.0)), "train.step")
    meta_ = StepMeta(str(meta["job_id"]), int(meta["cursor"]), str(meta["digest"]), scale)
    return blocks, arrays["tokens"].numpy(), meta_


def named_content(record: str, **fields) -> RecordDict:
    """A query's content: one ConfigRecord of plain values (hello, restore, finish)."""
    return RecordDict({record: ConfigRecord(fields)})


def read_named(
    content: RecordDict, record: str, message: str, names: tuple[str, ...] = (), ints: tuple[str, ...] = ()
) -> dict:
    """The fields of a query: ``names`` are plain folder names, ``ints`` integers; nothing else."""
    rec = content.config_records[record]
    expect_fields(rec, set(names) | set(ints), message)
    missing = sorted((set(names) | set(ints)) - set(rec))
    if missing:
        raise ProtocolError(f"{message} lacks field(s) {missing}")
    return {**{k: plain_name(rec[k], k.replace("_", " "), message) for k in names}, **{k: int(rec[k]) for k in ints}}


EXPOSURE = {"mse", "mean_baseline_mse", "ratio", "auxiliary_records"}  # a party's own inversion measurement


def read_exposure(content: RecordDict, party: str) -> dict:
    """A finish reply's ``exposure`` (app/vfl/exchange.py inversion): exactly its fields, finite numbers."""
    rec = content.config_records["exposure"]
    expect_fields(rec, EXPOSURE, f"party {party!r}'s query.finish reply")
    values = {k: float(rec[k]) for k in EXPOSURE if k in rec}
    if set(values) != EXPOSURE or not all(np.isfinite(v) for v in values.values()):
        raise ProtocolError(f"party {party!r}'s query.finish reply: exposure needs finite {sorted(EXPOSURE)}")
    return values | {"auxiliary_records": int(values["auxiliary_records"])}


def embeddings_content(emb: np.ndarray, state: dict | None = None) -> RecordDict:
    content = RecordDict({"out": ArrayRecord({"emb": Array(np.ascontiguousarray(emb))})})
    if state is not None:
        content["state"] = ConfigRecord(state)
    return content


def read_state(content: RecordDict) -> dict | None:
    rec = content.config_records.get("state")
    return (
        None
        if rec is None
        else {"digest": str(rec["digest"]), "applied": int(rec["applied"]), "epoch": int(rec["epoch"])}
    )


def read_embeddings(content: RecordDict, party: str = "", message: str = "train.step") -> np.ndarray:
    """The reply's embeddings (U, c); its shape, dtype and values are checked against what was
    asked by the receiver (strategies/vfl/exchange_checks.py)."""
    record = content.array_records.get("out")
    if record is None or set(record) != {"emb"}:
        found = "no 'out' record" if record is None else f"'out' holding {sorted(record)}"
        raise ProtocolError(f"party {party!r}'s reply to {message} has {found}; expected 'out' with 'emb' only")
    emb = record["emb"].numpy()
    require_finite(emb, party, "embeddings", f"the reply to {message}")
    return emb


def kept_embed_content(run: str, job_id: str, tokens: np.ndarray) -> RecordDict:
    """Predict: embed ``tokens`` (T,) with the party's kept model of ``run`` (query.embed_kept)."""
    return RecordDict(
        {
            "tokens": ArrayRecord({"tokens": Array(np.ascontiguousarray(tokens, dtype=np.int64))}),
            "kept": ConfigRecord({"run": run, "job_id": job_id}),
        }
    )


def read_kept_embed(content: RecordDict) -> tuple[str, str, np.ndarray]:
    """(run name, linkage job id, tokens (T,)) of a query.embed_kept; nothing else is accepted."""
    names = read_named(content, "kept", "query.embed_kept", names=("run", "job_id"))
    arrays = content.array_records["tokens"]
    expect_fields(arrays, {"tokens"}, "query.embed_kept")
    tokens = arrays["tokens"].numpy()
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise ProtocolError(
            f"query.embed_kept: tokens must be one vector of integers, got {tokens.dtype} {tokens.shape}"
        )
    return names["run"], names["job_id"], tokens
