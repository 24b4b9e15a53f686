"""The learning-rate schedule (issue 34): every lr-patience epochs without a better validation
value multiply every party's learning rate by lr-decay. The rule is a function of the records
(resumes continue it); the primary sets its own rate and sends the scale with each step, which a
secondary applies to its own rate and refuses outside (0, 1]; the federated run equals the
one-process twin given the same per-epoch scales."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Message

from app import messages
from app.config import ConfigError, RunConfig
from app.vfl import client as client_app
from app.vfl.inprocess import max_param_gap, run_in_process, run_twin
from app.vfl.secondary import SecondaryParty
from strategies.heads import TaskHead
from strategies.records import lr_scale
from strategies.vfl import protocol
from strategies.vfl.wire import GradBlock, StepRequest, step_digest
from tests.test_early_stopping import Script, recs
from tests.test_secondary_security import introduce, refused, simulated, weights
from tests.test_secondary_security import job as job  # a module fixture: the linkage job its parties hold

R = StepRequest.build  # a step as the primary builds it

REGRESSION, CLASSIFY = TaskHead("regression"), TaskHead("binary")


@pytest.mark.parametrize(
    "vals, head, want",
    [
        ([3.0, 2.0, 1.0], REGRESSION, 1.0),  # always better: constant
        ([3.0, 2.0, 2.5], REGRESSION, 0.5),  # one epoch without improvement (patience 1)
        ([3.0, 2.0, 2.5, 2.4, 2.1], REGRESSION, 0.125),  # every non-improving epoch is one more reduction
        ([3.0, 2.0, 2.5, 1.0, 0.9], REGRESSION, 0.5),  # improving again keeps the rate it reached
        ([0.5, 0.6, 0.55, 0.7], CLASSIFY, 0.5),  # accuracy: higher is better
        ([], REGRESSION, 1.0),
    ],
)
def test_the_rule_with_patience_one(vals, head, want):
    key = "rmse" if head is REGRESSION else "accuracy"
    assert lr_scale(recs(vals, key), head, 0.5, 1) == want


def test_patience_counts_from_the_best_or_the_last_reduction():
    flat = [3.0, 2.0] + [2.5] * 7  # best at epoch 1, then 7 epochs without improvement
    assert [lr_scale(recs(flat[:n]), REGRESSION, 0.1, 3) for n in range(2, 10)] == pytest.approx(
        [1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.01, 0.01]
    )
    assert lr_scale(recs(flat), REGRESSION, 1.0, 3) == 1.0  # decay 1: the paper's constant rate


def test_config_refuses_a_schedule_by_name():
    for flat, word in [
        ({"lr-decay": 0.0}, r"run-config 'lr-decay' must be in \(0, 1\]"),
        ({"lr-decay": 1.5}, r"run-config 'lr-decay' must be in \(0, 1\]"),
        ({"lr-patience": 0}, "run-config 'lr-patience' must be >= 1"),
        ({"lr-decay": 0.5, "mode": "entity-aug"}, "applies to mode 'vfl'"),
    ]:
        with pytest.raises(ConfigError, match=word):
            RunConfig.from_flower({"dataset": "hdb", **flat})
    assert RunConfig.from_flower({"lr-decay": 0.5, "lr-patience": 2}).train.lr_decay == 0.5


def test_the_scale_travels_in_the_step_and_is_checked():
    block = [GradBlock(np.array([1, 2]), np.ones((2, 3), dtype=np.float32))]
    tokens = np.array([0, 4])
    meta = messages.read_step(messages.step_content(R(block, tokens, "job", 5, lr_scale=0.25))).meta
    assert meta.lr_scale == 0.25
    assert meta.digest == step_digest("job", 5, block, tokens, 0.25)
    assert meta.digest != step_digest("job", 5, block, tokens)  # an altered scale fails the digest
    plain = messages.read_step(messages.step_content(R(block, tokens, "job", 5))).meta
    assert plain.lr_scale == 1.0 and plain.digest == step_digest("job", 5, block, tokens)
    for bad in (2.0, 0.0, -0.5, math.nan):
        content = messages.step_content(R(block, tokens, "job", 5, lr_scale=0.5))
        content.config_records["meta"]["lr_scale"] = bad  # a primary asking for more than the party's rate
        with pytest.raises(messages.ProtocolError, match="lr_scale"):
            messages.read_step(content)


# validation RMSE per epoch: better, worse (patience 1: x 0.5), worse (x 0.25), better (kept)
VALS = [3.0, 3.5, 3.6, 2.0]


def test_every_party_trains_at_the_scale_and_equals_the_twin(tmp_path, monkeypatch):
    """The scripted validation drives the schedule through a real in-process run; the twin, given
    the records' scales, computes the same losses and weights (float64); with a constant rate it
    does not (the comparison can fail)."""
    monkeypatch.setattr(protocol, "evaluate", Script("rmse", VALS).pair)
    seen = []
    real_fit = protocol.fit

    def recording_fit(*args, **kw):
        records, losses = real_fit(*args, **kw)
        seen.extend(r.lr_scale for r in records)
        return records, losses

    monkeypatch.setattr("app.vfl.inprocess.fit", recording_fit)
    cfg = RunConfig.of(
        dataset="hdb",
        n_rows=600,
        k=6,
        batch_size=64,
        epochs=4,
        lr_decay=0.5,
        lr_patience=1,
        steps_per_exchange=2,
        dtype="float64",
        out_dir=str(tmp_path),
    )
    fed = run_in_process(cfg)
    assert seen == [1.0, 1.0, 0.5, 0.25]  # each epoch trains at the scale its records before it give
    twin = run_twin(cfg, lr_scales=seen)
    np.testing.assert_allclose(fed.losses, twin.losses, rtol=1e-9, atol=1e-10)
    assert max_param_gap(fed.primary, twin.primary) < 1e-9
    assert max_param_gap(fed.secondaries["school"], twin.secondaries["school"]) < 1e-9
    constant = run_twin(cfg)
    assert max_param_gap(fed.secondaries["school"], constant.secondaries["school"]) > 1e-6
    assert max_param_gap(fed.primary, constant.primary) > 1e-6


@pytest.mark.usefixtures("run_identity")  # tests/conftest.py: a Message needs a run
def test_a_step_message_trains_at_its_lr_scale_and_a_larger_one_is_refused(tmp_path, job):
    """The primary's schedule (issue 34) reaches a Flower party: a step at lr_scale 0.5 moves the
    weights as the party object does at 0.5 (not as at 1); a scale above 1 (more than the
    party's own rate) is refused by name and changes no weight."""
    ctx, _ = simulated(tmp_path, job)
    party = introduce(ctx, job)
    tokens = np.arange(0, 40, 2)
    block = GradBlock(tokens, np.random.default_rng(1).normal(size=(20, 100)).astype(np.float32))
    before = weights(ctx)
    greedy = messages.step_content(R([block], tokens, party.job_id, 0, lr_scale=0.5))
    greedy.config_records["meta"]["lr_scale"] = 2.0
    err = refused(lambda: client_app.step(Message(greedy, dst_node_id=1, message_type="train.step"), ctx))
    assert isinstance(err, messages.ProtocolError) and "lr_scale" in str(err), err
    assert all(torch.equal(before[k], v) for k, v in weights(ctx).items())
    content = messages.step_content(R([block], tokens, party.job_id, 0, lr_scale=0.5))
    client_app.step(Message(content, dst_node_id=1, message_type="train.step"), ctx)
    got = weights(ctx)
    for scale, equal in ((0.5, True), (1.0, False)):
        direct = SecondaryParty(job.cfg, "school", str(job.folder))
        direct.apply([block], scale)
        same = all(torch.allclose(got[k], v, rtol=0, atol=1e-7) for k, v in direct.model.state_dict().items())
        assert same == equal, scale
