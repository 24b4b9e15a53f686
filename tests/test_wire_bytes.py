"""A step's request and reply packed for a direct link without Flower's records
(strategies/wire_bytes.py): what is packed comes back equal, and a body a hostile peer shaped
otherwise is refused by name before any array is allocated from it."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from strategies.entity_aug.channel import StepReply, StepRequest
from strategies.wire_bytes import MAX_HEADER, pack, unpack
from strategies.wire_checks import ProtocolError

MSG = "party 'bank''s reply to train.ea_step"


def _body(head: dict, tail: bytes = b"") -> bytes:
    raw = json.dumps(head).encode()
    return struct.pack(">I", len(raw)) + raw + tail


def test_a_step_request_and_reply_come_back_equal_and_writable():
    rng = np.random.default_rng(3)
    for req in (StepRequest(2, 7, rng.standard_normal((5, 3)).astype(np.float32)), StepRequest(1, -1, None)):
        got = StepRequest.decode(*unpack(pack(req.encode()), MSG))
        assert (got.epoch, got.step) == (req.epoch, req.step)
        assert (got.grad is None) == (req.grad is None)
        if req.grad is not None:
            assert got.grad.dtype == np.float32 and np.array_equal(got.grad, req.grad)
            got.grad[0, 0] = 1.0  # a copy the party may use as a tensor: not a read-only view of the body
    reply = StepReply(np.arange(4, dtype=np.int64), rng.standard_normal((4, 2)))
    got = StepReply.decode(*unpack(pack(reply.encode()), MSG), "bank")
    assert got.ids.dtype == np.int64 and np.array_equal(got.ids, reply.ids)
    assert got.act.dtype == np.float64 and np.array_equal(got.act, reply.act)
    arrays, fields = unpack(pack(({"empty": np.zeros((0, 3), np.float32)}, {"ok": True, "x": 1.5, "s": "a"})), MSG)
    assert arrays["empty"].shape == (0, 3) and fields == {"ok": True, "x": 1.5, "s": "a"}


BAD = {
    "too short for a header": b"\x00\x01",
    "a header of": struct.pack(">I", MAX_HEADER + 1) + b"{}" * MAX_HEADER,
    "does not parse": struct.pack(">I", 3) + b"{no",
    "exactly 'fields' and 'arrays'": _body({"fields": {}}),
    "plain scalars": _body({"fields": {"grad": [1, 2]}, "arrays": []}),
    "an array must be": _body({"fields": {}, "arrays": [["x", "|O", [1]]]}),  # objects: never
    "up to 4 sizes": _body({"fields": {}, "arrays": [["x", "<f4", [1, 1, 1, 1, 1]]]}),
    "one of": _body({"fields": {}, "arrays": [["x", ">f4", [1]]]}),  # byte order other than the sender's numpy's
    "sizes]": _body({"fields": {}, "arrays": [["x", "<f4", [-1]]]}),
    "runs past the body's end": _body({"fields": {}, "arrays": [["x", "<f8", [1 << 39, 1 << 39]]]}),
    "after the last array": _body({"fields": {}, "arrays": [["x", "<f4", [1]]]}, b"\x00" * 8),
    "names repeat": _body({"fields": {}, "arrays": [["x", "<f4", [1]], ["x", "<f4", [1]]]}, b"\x00" * 8),
}


@pytest.mark.parametrize("why", sorted(BAD))
def test_a_malformed_body_is_refused_naming_the_message(why):
    with pytest.raises(ProtocolError, match="train.ea_step") as err:
        unpack(BAD[why], MSG)
    assert why in str(err.value) and "party 'bank'" in str(err.value)


def test_a_float_size_is_not_a_size():
    with pytest.raises(ProtocolError, match="sizes"):
        unpack(_body({"fields": {}, "arrays": [["x", "<f4", [1.0]]]}, b"\x00" * 4), MSG)


def test_a_deeply_nested_header_is_refused_by_name_not_by_the_interpreter():
    """64 KiB of '[' parses to a recursion error in json, which is no ValueError: it must still be
    a refusal naming the message and its sender."""
    deep = b"[" * 60_000
    with pytest.raises(ProtocolError, match="party 'bank'"):
        unpack(struct.pack(">I", len(deep)) + deep, MSG)
