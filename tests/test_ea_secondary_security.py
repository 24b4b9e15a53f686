"""An Entity Augmentation secondary writes only under its own folder and refuses non-finite
gradients; its primary refuses non-finite activations (as a VFL secondary does:
tests/test_secondary_security.py, whose hand-made messages these tests share)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, RecordDict

from app import messages
from app.config import RunConfig
from app.entity_aug import client as ea_secondary
from app.entity_aug.parties import act_content, read_act, read_reply, reply_content, request_content
from strategies.entity_aug.channel import StepReply, StepRequest
from strategies.wire_bytes import pack, unpack
from strategies.wire_checks import PeerValueError
from tests.test_secondary_security import files_under, names, query, refused

pytestmark = pytest.mark.usefixtures("run_identity")  # tests/conftest.py: a Message needs a run


EA_RUN = {"dataset": "digits", "n-rows": 300, "mode": "entity-aug"}


def test_an_ea_secondary_writes_its_model_only_under_its_own_folder(tmp_path):
    own = tmp_path / "secondary-host"
    ctx = Context(
        run_id=1,
        node_id=1,
        node_config={"party": "right", "model-dir": str(own)},
        state=RecordDict(),
        run_config={**EA_RUN, "out-dir": str(tmp_path / "primary-chosen")},
    )
    ea_secondary.hello(query("query.ea_hello", "ea_hello", {}), ctx)
    evil = tmp_path / "evil"
    err = refused(
        lambda: ea_secondary.finish(query("query.ea_finish", "ea_finish", {"folder": str(evil), "run": "r1"}), ctx)
    )
    assert files_under(evil) == [], "the primary's message chose where the secondary wrote"
    assert isinstance(err, messages.ProtocolError) and "'folder'" in str(err), err
    with pytest.raises(messages.ProtocolError, match="plain folder name"):
        ea_secondary.finish(query("query.ea_finish", "ea_finish", {"run": "../../evil"}), ctx)
    ea_secondary.finish(query("query.ea_finish", "ea_finish", {"run": "r1"}), ctx)
    assert files_under(evil) == [] and files_under(tmp_path / "primary-chosen") == []
    assert [p.relative_to(own).as_posix() for p in files_under(own)] == ["r1/right/model.pt"]


def _after_first_step():
    """A simulated EA secondary ('right') after its first step: (cfg, context, the activations it
    sent (B, c), its weights then)."""
    cfg = RunConfig.from_flower(EA_RUN)
    ctx = Context(
        run_id=1,
        node_id=1,
        node_config={"partition-id": 1, "num-partitions": 2},
        state=RecordDict(),
        run_config=dict(EA_RUN),
    )
    ea_secondary.hello(query("query.ea_hello", "ea_hello", {}), ctx)
    first = ea_secondary.step(
        Message(request_content(StepRequest(0, 0, None)), dst_node_id=1, message_type="train.ea_step"), ctx
    )
    act = read_reply(first.content).act
    return cfg, ctx, act, {k: v.clone() for k, v in ea_secondary.restore(cfg, ctx).model.state_dict().items()}


def test_an_ea_secondary_refuses_a_non_finite_gradient_and_the_primary_a_non_finite_activation():
    cfg, ctx, act, before = _after_first_step()
    grad = np.zeros_like(act)
    grad[tuple(np.argwhere(act != 0)[0])] = np.nan  # where the activation passes a gradient on
    err = refused(
        lambda: ea_secondary.step(
            Message(request_content(StepRequest(0, 1, grad)), dst_node_id=1, message_type="train.ea_step"), ctx
        )
    )
    after = ea_secondary.restore(cfg, ctx).model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "a NaN gradient reached the secondary's weights"
    assert isinstance(err, messages.NonFiniteValues), err
    assert names(err, "party 'right'", "train.ea_step", "gradient", "1 of")

    bad = act.copy()
    bad[0, :2] = np.inf
    err = refused(lambda: read_reply(reply_content(StepReply(np.arange(len(bad)), bad)), party="left"))
    assert names(err, "party 'left'", "train.ea_step", "activations", f"2 of {bad.size}")
    err = refused(lambda: read_act(act_content(bad), party="left"))
    assert names(err, "party 'left'", "query.ea_embed", "activations", f"2 of {bad.size}")


def test_an_ea_secondary_refuses_a_gradient_of_the_wrong_shape_naming_itself():
    """One row short of what it sent: refused with the party's name, no weight changed."""
    cfg, ctx, act, before = _after_first_step()
    short = np.ones_like(act)[:-1]
    err = refused(
        lambda: ea_secondary.step(
            Message(request_content(StepRequest(0, 1, short)), dst_node_id=1, message_type="train.ea_step"), ctx
        )
    )
    after = ea_secondary.restore(cfg, ctx).model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert isinstance(err, PeerValueError), err
    assert all(p in str(err) for p in ("party 'right'", "gradient", f"{short.shape}", f"{act.shape}")), err


def test_over_a_direct_link_the_packed_step_is_refused_alike():
    """The party worker's step (packed without Flower's records: strategies/wire_bytes.py)
    refuses what the Flower message's refuses, naming the party, and a body that is not a
    request naming the message; no weight changes. A good one answers with finite activations."""
    cfg, ctx, act, before = _after_first_step()
    step = ea_secondary.DIRECT["train.ea_step"]
    grad = np.zeros_like(act)
    grad[tuple(np.argwhere(act != 0)[0])] = np.inf
    err = refused(lambda: step(pack(StepRequest(0, 1, grad).encode()), ctx))
    assert isinstance(err, messages.NonFiniteValues) and names(err, "party 'right'", "train.ea_step", "gradient")
    err = refused(lambda: step(pack(({"grad": grad, "extra": grad}, {"epoch": 0, "step": 1, "has_grad": True})), ctx))
    assert isinstance(err, messages.ProtocolError) and "train.ea_step" in str(err), err
    err = refused(lambda: step(b"\x00\x00\x00\x05{oops", ctx))
    assert isinstance(err, messages.ProtocolError) and "train.ea_step" in str(err), err
    after = ea_secondary.restore(cfg, ctx).model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    reply = StepReply.decode(*unpack(step(pack(StepRequest(0, 1, np.zeros_like(act)).encode()), ctx), "reply"), "right")
    assert reply.act.shape[1] == act.shape[1] and np.isfinite(reply.act).all()


@pytest.mark.parametrize("ids", [[-1, -2], [[0, 1, 2], [3, 4, 5]], [0.5, 1.7], [10_000], [True, False]], ids=str)
def test_an_ea_secondary_embeds_only_ids_among_its_rows_and_names_the_primary(ids):
    """query.ea_embed (evaluation): ids must be one vector of integers in [0, n); a negative id
    indexed its rows from the end, a 2-D array came back as a 3-D block, others died naming no one."""
    from flwr.app import Array, ArrayRecord

    _, ctx, _, _ = _after_first_step()
    msg = Message(
        RecordDict({"ea": ArrayRecord({"ids": Array(np.asarray(ids))})}), dst_node_id=1, message_type="query.ea_embed"
    )
    with pytest.raises(messages.ProtocolError, match=r"the primary.*query\.ea_embed.*ids"):
        ea_secondary.embed(msg, ctx)
