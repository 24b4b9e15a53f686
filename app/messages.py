"""Wire format of the protocol's messages over Flower: numpy arrays in ArrayRecords, scalars in
ConfigRecords. A step's request and reply are strategies/vfl/wire.py's types with their codec:
here they are only wrapped in records.

No message names a path: a party reads and writes only under its own configured folders
(app/node.py); a message may name a run or a linkage job, each one plain folder name. Every
reader refuses a field it does not know and a non-finite tensor, naming the party and message."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from strategies.vfl.wire import StepReply, StepRequest, require_lr_scale  # noqa: F401 - re-exported
from strategies.wire_checks import (  # noqa: F401 - re-exported: the checks every reader of a message applies
    PLAIN_NAME,
    NonFiniteValues,  # the readers' refusal
    ProtocolError,
    expect_fields,
    peer_integer,
    plain_name,
    read_count,
    read_number,
    read_text,
    require_finite,
)


def flower(handler: Callable[[RecordDict, Context], RecordDict]) -> Callable[[Message, Context], Message]:
    """A content handler, (RecordDict, Context) -> RecordDict, as a ClientApp handler: its reply
    goes back through Flower; the direct transport's party worker calls the content handler itself."""

    @functools.wraps(handler)
    def on_message(msg: Message, context: Context) -> Message:
        return Message(handler(msg.content, context), reply_to=msg)

    return on_message


def wrapped(codec: tuple[dict, dict], arrays: str, fields: str) -> RecordDict:
    """A core type's codec, (numpy arrays, plain scalars), as one ArrayRecord and one ConfigRecord."""
    values, scalars = codec
    return RecordDict({arrays: ArrayRecord({k: Array(v) for k, v in values.items()}), fields: ConfigRecord(scalars)})


def unwrapped(content: RecordDict, arrays: str, fields: str) -> tuple[dict, dict]:
    """:func:`wrapped`'s inverse, for a core type's ``decode`` (the caller checks the records are there)."""
    return {k: v.numpy() for k, v in content.array_records[arrays].items()}, dict(content.config_records[fields])


def step_content(req: StepRequest) -> RecordDict:
    """train.step's content: the request's arrays and scalars (strategies/vfl/wire.py's codec)."""
    return wrapped(req.encode(), "step", "meta")


def read_step(content: RecordDict) -> StepRequest:
    """The step, checked as StepRequest.decode checks it; the party checks the blocks' values
    (finite in its own dtype, shapes, tokens) before it applies any."""
    if "step" not in content.array_records or "meta" not in content.config_records:
        raise ProtocolError("train.step lacks its 'step' arrays or its 'meta' record")
    return StepRequest.decode(*unwrapped(content, "step", "meta"))


def reply_content(reply: StepReply) -> RecordDict:
    """A secondary's answer to train.step or query.embed_kept (the codec of StepReply)."""
    return wrapped(reply.encode(), "out", "reply")


def read_reply(content: RecordDict, party: str = "", message: str = "train.step") -> StepReply:
    """The answer of ``party``, checked as StepReply.decode checks it."""
    if set(content) != {"out", "reply"} or "out" not in content.array_records:
        raise ProtocolError(f"party {party!r}'s reply to {message} holds {sorted(content)}; expected 'out' and 'reply'")
    return StepReply.decode(*unwrapped(content, "out", "reply"), party, message)


def named_content(record: str, **fields) -> RecordDict:
    """A query's content: one ConfigRecord of plain values (hello, restore, finish)."""
    return RecordDict({record: ConfigRecord(fields)})


def read_named(
    content: RecordDict,
    record: str,
    message: str,
    names: tuple[str, ...] = (),
    ints: tuple[str, ...] = (),
    optional: tuple[str, ...] = (),
) -> dict:
    """The fields of a query: ``names`` are plain folder names, ``ints`` non-negative integers
    (an epoch, a count; :func:`read_count`, never coerced), ``optional`` plain names that may be
    absent ("" then); nothing else."""
    rec = content.config_records[record]
    expect_fields(rec, set(names) | set(ints) | set(optional), message)
    missing = sorted((set(names) | set(ints)) - set(rec))
    if missing:
        raise ProtocolError(f"{message} lacks field(s) {missing}")
    plain = [*names, *(k for k in optional if k in rec)]
    return {
        **dict.fromkeys(optional, ""),
        **{k: plain_name(rec[k], k.replace("_", " "), message) for k in plain},
        **{k: read_count(rec, k, message) for k in ints},
    }


EXPOSURE = {"mse", "mean_baseline_mse", "ratio", "auxiliary_records"}  # a party's own inversion measurement


def read_exposure(content: RecordDict, party: str) -> dict:
    """A finish reply's ``exposure`` (app/vfl/exchange.py inversion): exactly its fields, finite numbers."""
    rec = content.config_records["exposure"]
    expect_fields(rec, EXPOSURE, f"party {party!r}'s query.finish reply")
    who = f"party {party!r}'s query.finish reply"
    values = {k: read_number(rec, k, who) for k in sorted(EXPOSURE - {"auxiliary_records"})}
    return values | {"auxiliary_records": read_count(rec, "auxiliary_records", who)}


def kept_embed_content(run: str, job_id: str, tokens: np.ndarray, attempt: str = "") -> RecordDict:
    """Predict: embed ``tokens`` (T,) with the party's kept model of ``run`` from its training
    ``attempt`` (app/kept.py attempt_id; "" for a run kept before attempts: query.embed_kept)."""
    return RecordDict(
        {
            "tokens": ArrayRecord({"tokens": Array(np.ascontiguousarray(tokens, dtype=np.int64))}),
            "kept": ConfigRecord({"run": run, "job_id": job_id, **({"attempt": attempt} if attempt else {})}),
        }
    )


def read_kept_embed(content: RecordDict) -> tuple[dict, np.ndarray]:
    """({"run", "job_id", "attempt"}, tokens (T,)) of a query.embed_kept; nothing else is accepted."""
    names = read_named(content, "kept", "query.embed_kept", names=("run", "job_id"), optional=("attempt",))
    arrays = content.array_records["tokens"]
    expect_fields(arrays, {"tokens"}, "query.embed_kept")
    tokens = arrays["tokens"].numpy()
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise ProtocolError(
            f"query.embed_kept: tokens must be one vector of integers, got {tokens.dtype} {tokens.shape}"
        )
    return names, tokens
