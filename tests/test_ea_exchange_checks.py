"""Entity Augmentation's exchange holds every peer to what the receiver asked for, as FedSim's does
(strategies/vfl/exchange_checks.py): a secondary applies only a gradient of exactly its own dtype
and shape, finite and within the bound; the primary uses only activations of exactly its dtype and
each party's width, finite and within the bound, and entity ids it holds labels for. A refusal
names the sender and changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.config import RunConfig
from app.entity_aug.parties import build_party, build_primary, ea_data
from strategies.entity_aug.channel import StepRequest
from strategies.wire_checks import EXCHANGE_BOUND, PeerValueError

CFG = RunConfig.of(dataset="digits", n_rows=300, mode="entity-aug")


@pytest.fixture(scope="module")
def data():
    return ea_data(CFG)


def _weights(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _same(before: list[torch.Tensor], module: torch.nn.Module) -> bool:
    return all(torch.equal(b, p) for b, p in zip(before, module.parameters()))


GRADIENTS = {  # (B, c) float32 activations -> what a hostile primary sends back
    "float32 at float32's largest": lambda a: np.full_like(a, np.float32(3.4e38)),
    "float32 over the bound": lambda a: np.full_like(a, np.float32(EXCHANGE_BOUND * 10)),
    "float64 (not the party's dtype)": lambda a: np.zeros(a.shape, dtype=np.float64),
    "bool": lambda a: np.ones(a.shape, dtype=bool),
    "int64": lambda a: np.full(a.shape, 2**40, dtype=np.int64),
    "one column short": lambda a: np.zeros((a.shape[0], a.shape[1] - 1), dtype=a.dtype),
}


@pytest.mark.parametrize("case", sorted(GRADIENTS))
def test_a_secondary_refuses_a_poisoned_gradient_naming_the_primary_and_keeps_its_weights(case, data):
    party = build_party(CFG, data.secondaries[0], data)
    act = party.step(StepRequest(0, 0, None)).act  # (B, c): the activation the gradient is for
    before = _weights(party.model)
    with pytest.raises(PeerValueError, match=rf"party {data.secondaries[0]!r}: .*from the primary.*train\.ea_step"):
        party.step(StepRequest(0, 1, GRADIENTS[case](act)))
    assert _same(before, party.model)


def test_a_secondary_applies_an_honest_gradient_and_one_at_the_bound(data):
    party = build_party(CFG, data.secondaries[0], data)
    act = party.step(StepRequest(0, 0, None)).act
    before = _weights(party.model)
    party.step(StepRequest(0, 1, np.full_like(act, np.float32(EXCHANGE_BOUND))))  # the bound itself: accepted
    assert not _same(before, party.model)


def _replies(data):
    """Every party's honest step-0 reply: {party: (ids (B,), activations (B, c))}."""
    out = {}
    for p in data.parties:
        reply = build_party(CFG, p, data).step(StepRequest(0, 0, None))
        out[p] = (reply.ids, reply.act)
    return out


ACTIVATIONS = {  # (ids, act) -> what a hostile secondary replies
    "activations at float32's largest": lambda i, a: (i, np.full_like(a, np.float32(3.4e38))),
    "activations over the bound": lambda i, a: (i, np.full_like(a, np.float32(EXCHANGE_BOUND * 10))),
    "float64 activations": lambda i, a: (i, a.astype(np.float64)),
    "one column wider": lambda i, a: (i, np.hstack([a, a[:, :1]])),
    "negative ids": lambda i, a: (-1 - i, a),
    "ids past the entities": lambda i, a: (i + 10**6, a),
    "float ids": lambda i, a: (i.astype(np.float64), a),
    "one id short": lambda i, a: (i[:-1], a[:-1]),
}


@pytest.mark.parametrize("case", sorted(ACTIVATIONS))
def test_the_primary_refuses_a_poisoned_training_reply_naming_its_sender_before_any_weight_changes(case, data):
    primary = build_primary(CFG, data)
    replies = _replies(data)
    hostile = data.secondaries[-1]
    replies[hostile] = ACTIVATIONS[case](*replies[hostile])
    before = _weights(primary.model)
    with pytest.raises(PeerValueError, match=rf"the primary: .*{hostile!r}"):  # "from party 'x'" or its ids' shape
        primary.train_step({p: a for p, (_, a) in replies.items()}, {p: i for p, (i, _) in replies.items()})
    assert _same(before, primary.model)


@pytest.mark.parametrize("case", ["activations over the bound", "float64 activations", "one column wider"])
def test_the_primary_refuses_a_poisoned_evaluation_reply_naming_its_sender(case, data):
    primary = build_primary(CFG, data)
    replies = _replies(data)
    hostile = data.secondaries[-1]
    replies[hostile] = ACTIVATIONS[case](*replies[hostile])
    with pytest.raises(PeerValueError, match=rf"the primary: .*from party {hostile!r}"):
        primary.predict({p: a for p, (_, a) in replies.items()}, len(replies[data.parties[0]][0]))


def test_honest_replies_train_and_predict(data):
    primary = build_primary(CFG, data)
    replies = _replies(data)
    loss, grads = primary.train_step({p: a for p, (_, a) in replies.items()}, {p: i for p, (i, _) in replies.items()})
    assert np.isfinite(loss) and set(grads) == set(data.secondaries)
    rows = len(replies[data.parties[0]][0])
    assert len(primary.predict({p: a for p, (_, a) in replies.items()}, rows)) == rows


def test_a_run_whose_own_loss_stops_being_finite_fails_naming_the_step_not_finishing_with_nan(tmp_path, monkeypatch):
    """Honest parties, the primary's own learning rate 1e30: its training diverges. The run must
    fail with a reason, not finish with NaN metrics and a kept model: the diverged loss's
    gradients are non-finite, and the first secondary they reach refuses them naming the primary."""
    from app.entity_aug import server
    from strategies.entity_aug.channel import LocalChannel

    def diverging(cfg, data):
        primary = build_primary(cfg, data)
        for group in primary.optimizer.param_groups:
            group["lr"] = 1e30  # the primary's alone: the secondaries train at the run's
        return primary

    monkeypatch.setattr(server, "build_primary", diverging)
    cfg = CFG.replace(epochs=2, out_dir=str(tmp_path / "out"))
    data = ea_data(cfg)
    channel = LocalChannel({p: build_party(cfg, p, data) for p in data.parties})
    with pytest.raises(
        PeerValueError, match=r"party '\w+': gradient from the primary in train\.ea_step: .* non-finite"
    ):
        server.run_ea(cfg, data, channel, tmp_path / "run", "inprocess")


@pytest.mark.parametrize("case", ["empty", "no act", "act as a config record", "two arrays"])
def test_an_evaluation_reply_without_its_activations_is_refused_naming_the_party(case):
    """A bare KeyError named no one before."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    from app.entity_aug.parties import read_act
    from strategies.wire_checks import ProtocolError

    act = Array(np.zeros((2, 3), np.float32))
    content = {
        "empty": RecordDict(),
        "no act": RecordDict({"ea": ArrayRecord({"ids": act})}),
        "act as a config record": RecordDict({"ea": ConfigRecord({"act": 1})}),
        "two arrays": RecordDict({"ea": ArrayRecord({"act": act, "more": act})}),
    }[case]
    with pytest.raises(ProtocolError, match=r"party 'left''s reply to query\.ea_embed"):
        read_act(content, "left")


@pytest.mark.parametrize("split", ["test", "val"])
def test_the_primary_refuses_ids_outside_a_guests_training_entities_naming_it(split, data):
    """Ids in [0, n) were all accepted: a guest sending the test (or validation) entities' ids had
    the primary train on their labels (test accuracy 0.84 where its own training ids gave 0.72)
    and got back a gradient for each of them. The primary built every guest's schedule: it
    accepts only the guest's own training entities."""
    primary = build_primary(CFG, data)
    replies = _replies(data)
    hostile = data.secondaries[0]
    ids, act = replies[hostile]
    replies[hostile] = (np.resize(getattr(data.split, split), len(ids)).astype(ids.dtype), act)
    before = _weights(primary.model)
    with pytest.raises(PeerValueError, match=rf"entity ids from party {hostile!r} .*not among its training entities"):
        primary.train_step({p: a for p, (_, a) in replies.items()}, {p: i for p, (i, _) in replies.items()})
    assert _same(before, primary.model)
