"""What a secondary answers per step (strategies/vfl/wire.py StepReply): its embeddings, the
checkpoint a step saved, and how many gradient blocks it has applied; the primary refuses a reply
whose count is not the number of blocks it sent that party (a party that skipped or replayed
blocks), naming the party."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from app import messages
from app.vfl.channel import FlowerChannel
from strategies.vfl.protocol import checked
from strategies.vfl.wire import GradBlock, StepReply
from strategies.wire_checks import PeerValueError


def test_the_reply_codec_round_trips_what_a_step_answers():
    emb = np.ones((2, 3), np.float32)
    reply = StepReply(emb, {"digest": "ab", "applied": 7, "epoch": 1}, applied=7)
    back = messages.read_reply(messages.reply_content(reply), "a")
    assert back.state == reply.state and back.applied == 7 and np.array_equal(back.emb, emb)
    assert messages.read_reply(messages.reply_content(StepReply(emb)), "a").applied is None  # predict's replies


class SkippingGrid:
    """Nodes that answer every train.step without applying its blocks: 'applied' stays 0."""

    def __init__(self) -> None:
        self.sent = {}

    def push_messages(self, msgs):
        ids = [f"m{i}" for i in range(len(msgs))]
        self.sent = dict(zip(ids, msgs))
        return ids

    def pull_messages(self, ids):
        def answer(m):
            tokens = messages.read_step(m.content).tokens
            return messages.reply_content(StepReply(np.zeros((len(tokens), 3), np.float32), applied=0))

        return [
            SimpleNamespace(
                has_error=lambda: False,
                content=answer(m),
                metadata=SimpleNamespace(reply_to_message_id=i, src_node_id=m.metadata.dst_node_id),
            )
            for i, m in self.sent.items()
            if i in ids
        ]


def test_the_primary_refuses_a_reply_that_did_not_apply_what_it_was_sent(run_identity):
    channel = FlowerChannel(SkippingGrid(), {"a": 11, "b": 12}, timeout=5, job_id="j")
    tokens = {"a": np.arange(4), "b": np.arange(4)}
    block = GradBlock(np.arange(4), np.zeros((4, 3), np.float32))
    replies = channel.step({"a": [block, block], "b": []}, tokens)  # party a was sent 2 blocks, b none
    strategy = SimpleNamespace(model=SimpleNamespace(cuts={"a": 3, "b": 3}), dtype=torch.float32)
    with pytest.raises(PeerValueError, match=r"party 'a' says it has applied 0 gradient blocks; it was sent 2"):
        checked(strategy, replies, tokens, "train.step", channel.cursor)
    assert set(checked(strategy, {"b": replies["b"]}, {"b": tokens["b"]}, "train.step", channel.cursor)) == {"b"}


# ---------------------------------------------------------------------------- Entity Augmentation's step


def test_an_ea_step_or_reply_with_a_field_the_protocol_lacks_is_refused_by_name():
    from app.entity_aug import parties as ea_wire
    from strategies.entity_aug.channel import StepReply as EAReply
    from strategies.entity_aug.channel import StepRequest as EARequest

    content = ea_wire.request_content(EARequest(0, 3, np.ones((2, 4), np.float32)))
    content.config_records["ea_meta"]["path"] = "/tmp/elsewhere"  # a primary steering a party
    with pytest.raises(messages.ProtocolError, match=r"train.ea_step carries field\(s\) \['path'\]"):
        ea_wire.read_request(content)
    assert ea_wire.read_request(ea_wire.request_content(EARequest(0, 3, None))).grad is None
    reply = ea_wire.reply_content(EAReply(np.arange(3), np.ones((2, 4), np.float32)))  # 3 ids, 2 rows
    with pytest.raises(messages.ProtocolError, match=r"party 'left'.*ids int64 \(3,\) for activations \(2, 4\)"):
        ea_wire.read_reply(reply, "left")
