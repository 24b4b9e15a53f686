"""Wire format of the protocol's messages: numpy arrays in ArrayRecords, scalars in ConfigRecords."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from strategies.fedsim import GradBlock


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


def step_digest(job_id: str, cursor: int, apply: list[GradBlock], tokens: np.ndarray) -> str:
    h = hashlib.sha256(f"{job_id}|{cursor}|{len(apply)}|".encode())
    for block in apply:
        h.update(np.ascontiguousarray(block.tokens, dtype=np.int64).tobytes())
        h.update(b"|")
    h.update(np.ascontiguousarray(tokens, dtype=np.int64).tobytes())
    return h.hexdigest()[:32]


def step_content(apply: list[GradBlock], tokens: np.ndarray, job_id: str = "", cursor: int = 0,
                 save: tuple[str, str, int] | None = None) -> RecordDict:
    """A step: gradient blocks to apply, then tokens to embed; ``save`` = (folder, run, epoch)
    asks the party to checkpoint between the two."""
    arrays = {"tokens": Array(np.ascontiguousarray(tokens, dtype=np.int64))}
    for j, block in enumerate(apply):
        arrays[f"apply_tokens_{j}"] = Array(np.ascontiguousarray(block.tokens, dtype=np.int64))
        arrays[f"apply_grad_{j}"] = Array(np.ascontiguousarray(block.grad))
    meta = {"n_apply": len(apply), "job_id": job_id, "cursor": cursor,
            "digest": step_digest(job_id, cursor, apply, tokens)}
    if save is not None:
        meta.update(save_folder=save[0], save_run=save[1], save_epoch=save[2])
    return RecordDict({"step": ArrayRecord(arrays), "meta": ConfigRecord(meta)})


def read_save(content: RecordDict) -> tuple[str, str, int] | None:
    meta = content.config_records["meta"]
    return (str(meta["save_folder"]), str(meta["save_run"]), int(meta["save_epoch"])) if "save_epoch" in meta else None


def read_step(content: RecordDict) -> tuple[list[GradBlock], np.ndarray, StepMeta]:
    arrays = content.array_records["step"]
    meta = content.config_records["meta"]
    n = int(meta["n_apply"])
    blocks = [GradBlock(arrays[f"apply_tokens_{j}"].numpy(), arrays[f"apply_grad_{j}"].numpy()) for j in range(n)]
    return blocks, arrays["tokens"].numpy(), StepMeta(str(meta["job_id"]), int(meta["cursor"]), str(meta["digest"]))


def embeddings_content(emb: np.ndarray, state: dict | None = None) -> RecordDict:
    content = RecordDict({"out": ArrayRecord({"emb": Array(np.ascontiguousarray(emb))})})
    if state is not None:
        content["state"] = ConfigRecord(state)
    return content


def read_state(content: RecordDict) -> dict | None:
    rec = content.config_records.get("state")
    return None if rec is None else {"digest": str(rec["digest"]), "applied": int(rec["applied"]),
                                     "epoch": int(rec["epoch"])}


def read_embeddings(content: RecordDict) -> np.ndarray:
    return content.array_records["out"]["emb"].numpy()


def payload_bytes(content: RecordDict) -> int:
    """Bytes of array data in a message (what the protocol moves; headers excluded)."""
    return sum(len(a.data) for rec in content.array_records.values() for a in rec.values())
