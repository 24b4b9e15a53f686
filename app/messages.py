"""Wire format of the protocol's messages: numpy arrays in ArrayRecords, scalars in ConfigRecords."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from strategies.fedsim import GradBlock


def step_content(apply: list[GradBlock], tokens: np.ndarray) -> RecordDict:
    arrays = {"tokens": Array(np.ascontiguousarray(tokens, dtype=np.int64))}
    for j, block in enumerate(apply):
        arrays[f"apply_tokens_{j}"] = Array(np.ascontiguousarray(block.tokens, dtype=np.int64))
        arrays[f"apply_grad_{j}"] = Array(np.ascontiguousarray(block.grad))
    return RecordDict({"step": ArrayRecord(arrays), "meta": ConfigRecord({"n_apply": len(apply)})})


def read_step(content: RecordDict) -> tuple[list[GradBlock], np.ndarray]:
    arrays = content.array_records["step"]
    n = int(content.config_records["meta"]["n_apply"])
    blocks = [GradBlock(arrays[f"apply_tokens_{j}"].numpy(), arrays[f"apply_grad_{j}"].numpy()) for j in range(n)]
    return blocks, arrays["tokens"].numpy()


def tokens_content(tokens: np.ndarray) -> RecordDict:
    return RecordDict({"step": ArrayRecord({"tokens": Array(np.ascontiguousarray(tokens, dtype=np.int64))})})


def read_tokens(content: RecordDict) -> np.ndarray:
    return content.array_records["step"]["tokens"].numpy()


def embeddings_content(emb: np.ndarray) -> RecordDict:
    return RecordDict({"out": ArrayRecord({"emb": Array(np.ascontiguousarray(emb))})})


def read_embeddings(content: RecordDict) -> np.ndarray:
    return content.array_records["out"]["emb"].numpy()


def payload_bytes(content: RecordDict) -> int:
    """Bytes of array data in a message (what the protocol moves; headers excluded)."""
    return sum(len(a.data) for rec in content.array_records.values() for a in rec.values())
