"""A hostile party's tensors (strategies/wire_checks.py): refused by name before any
weight changes, in both directions; the run fails, never returns NaN losses or metrics.

The primary's side runs the real protocol (strategies.vfl.protocol.fit) and the real parties of
a small hdb run, over a channel that passes messages as host arrays (as Flower and the direct
transport do) and lets one party's replies be tampered with after it computed them honestly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.config import RunConfig
from app.vfl.inprocess import _local_parties, _setup
from app.vfl.parties import build_strategy
from bench.poisoning import CFG, Tampered, _set
from strategies.vfl.protocol import fit
from strategies.vfl.wire import GradBlock
from strategies.wire_checks import EXCHANGE_BOUND, PeerValueError


def _run(tmp_path, tamper, after=0):
    cfg, settings, ds, linkage, job, plan = _setup(RunConfig.of(**CFG, out_dir=str(tmp_path)), None)
    strategy = build_strategy(ds, linkage, cfg, settings)
    parties = _local_parties(cfg, ds, job, linkage)
    before = {k: v.clone() for k, v in strategy.model.state_dict().items()}
    channel = Tampered(parties, "school", tamper, after)
    records, losses = fit(strategy, channel, ds.split, plan)
    return records, losses, strategy, before


POISON = {
    "float32 max": (_set(np.float32(3.4e38)), r"magnitude 3\.4e\+38, over the receiver's bound 1e\+06"),
    "one 1e300 cell in float64": (_set(1e300, np.float64), "dtype float64, expected float32"),
    "a row missing": (lambda e: e[:-1], r"shape \(\d+, 100\), expected"),
    "five rows extra": (lambda e: np.vstack([e, e[:5]]), r"shape \(\d+, 100\), expected"),
    "width c + 1": (lambda e: np.hstack([e, e[:, :1]]), r"shape \(\d+, 101\), expected \(\d+, 100\)"),
    "width c - 1": (lambda e: e[:, :-1], r"shape \(\d+, 99\), expected \(\d+, 100\)"),
    "1-D": (lambda e: e.ravel(), r"shape \(\d+,\), expected"),
    "3-D": (lambda e: e[None], r"shape \(1, \d+, 100\), expected"),
    "0-D": (lambda e: np.float32(1.0), "expected an array, got float32"),
    "empty": (lambda e: e[:0], r"shape \(0, 100\), expected"),
    "int64": (lambda e: e.astype(np.int64), "dtype int64, expected float32"),
    "bool": (lambda e: e > 0, "dtype bool, expected float32"),
    "uint8": (lambda e: e.astype(np.uint8), "dtype uint8, expected float32"),
    "float16": (lambda e: e.astype(np.float16), "dtype float16, expected float32"),
    "complex64": (lambda e: e.astype(np.complex64), "dtype complex64, expected float32"),
    "strings": (lambda e: e.astype(str), "dtype <U.*, expected float32"),
}


@pytest.mark.parametrize("case", sorted(POISON))
def test_a_secondarys_poisoned_training_reply_is_refused_naming_it_before_any_weight_changes(case, tmp_path):
    tamper, words = POISON[case]
    with pytest.raises(PeerValueError, match=words) as refused:
        _run(tmp_path, tamper)
    assert "embeddings from party 'school'" in str(refused.value) and "train.step" in str(refused.value)


def test_a_huge_value_only_in_an_evaluation_reply_fails_the_run_instead_of_choosing_the_best_epoch(tmp_path):
    """Every training reply is honest; the last (the evaluation's) holds float32's largest value."""
    records, losses, _, _ = _run(tmp_path / "honest", lambda e: e)
    with pytest.raises(PeerValueError, match="party 'school'.*over the receiver's bound"):
        _run(tmp_path / "poisoned", _set(np.float32(3.4e38)), after=len(losses))  # one reply a step, then eval


def test_honest_replies_through_the_checks_train_as_before(tmp_path):
    records, losses, strategy, before = _run(tmp_path, lambda e: e)
    assert len(losses) >= 5 and np.isfinite(losses).all() and all(np.isfinite(list(records[-1].val.values())))
    after = strategy.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_a_value_just_under_the_bound_is_accepted_and_just_over_refused(tmp_path):
    from strategies.wire_checks import Expect, check_block

    expect = Expect("party 's'", "embeddings", "train.step", (2, 3), torch.float32)
    ok = np.full((2, 3), EXCHANGE_BOUND, np.float32)
    assert check_block(ok, expect) is ok
    with pytest.raises(PeerValueError, match="party 's'"):
        check_block(np.nextafter(ok, np.float32(np.inf)), expect)


def test_the_secondary_refuses_a_finite_but_huge_gradient_from_the_primary_and_keeps_its_weights(tmp_path):
    cfg, settings, ds, linkage, job, plan = _setup(RunConfig.of(**CFG, out_dir=str(tmp_path)), None)
    party = _local_parties(cfg, ds, job, linkage)["school"]
    before = {k: v.clone() for k, v in party.model.state_dict().items()}
    tokens = np.arange(0, 10, dtype=np.int64)
    good = GradBlock(tokens, np.ones((10, 100), np.float32) * 1e-3)
    huge = good.grad.copy()
    huge[4, 2] = np.float32(3e38)
    for blocks, words in (
        ([good, GradBlock(tokens, huge)], "gradient block 1 from the primary.*over the receiver's bound"),
        ([GradBlock(tokens.astype(np.float64), good.grad)], "tokens from the primary must be one vector of integers"),
        ([GradBlock(tokens[:, None], good.grad)], "tokens from the primary must be one vector of integers"),
    ):
        with pytest.raises(PeerValueError, match=f"party 'school': {words}"):
            party.apply(blocks)
    assert party.applied == 0 and all(torch.equal(before[k], v) for k, v in party.model.state_dict().items())


def test_a_run_whose_own_loss_stops_being_finite_fails_naming_the_step_not_returning_nan(tmp_path):
    """Honest replies, the primary's own learning rate 1e30: its training diverges."""
    from strategies.vfl.exchange_checks import TrainingDiverged

    cfg, settings, ds, linkage, job, plan = _setup(RunConfig.of(**CFG, out_dir=str(tmp_path)), None)
    strategy = build_strategy(ds, linkage, cfg, settings)
    strategy.lr = 1e30  # the primary's alone: the secondaries train at the run's
    parties = _local_parties(cfg, ds, job, linkage)
    # the loss check, or the secondary refusing the NaN gradients the diverged model sends: a named failure
    with pytest.raises(
        (TrainingDiverged, PeerValueError), match=r"training loss is (nan|inf) at step|from the primary"
    ):
        fit(strategy, Tampered(parties, "school", lambda e: e), ds.split, plan)
