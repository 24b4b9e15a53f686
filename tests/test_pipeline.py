"""The pipelined protocol (run-config pipeline = true, strategies/vfl/protocol.py): window w + 1's
request goes out before window w is computed. It is not exact split learning, so: its one-process
twin (the same staleness, by construction) is the oracle, the staleness is asserted to be
exactly one more window, and the oracle can tell it from the unpipelined schedule."""

import json

import numpy as np
import pytest

from app.config import RunConfig
from app.vfl.inprocess import max_param_gap, run_in_process, run_twin
from strategies.vfl import protocol
from strategies.vfl.channel import LocalChannel
from strategies.vfl.primary import PrimaryParty
from tests.test_equivalence import CASES

S = 3


def test_pipelined_protocol_equals_its_twin(tmp_path):
    """Float64, 1e-9, over two epochs: the pipeline drains at the first's end, then refills."""
    cfg = RunConfig.of(
        **CASES["synthetic-binary-avg"],
        epochs=2,
        steps_per_exchange=S,
        pipeline=True,
        dtype="float64",
        out_dir=str(tmp_path),
    )
    fed, twin = run_in_process(cfg), run_twin(cfg)
    assert len(fed.losses) == len(twin.losses) >= 14
    np.testing.assert_allclose(fed.losses, twin.losses, rtol=1e-9, atol=1e-10)
    assert max_param_gap(fed.primary, twin.primary) < 1e-9
    for party in fed.secondaries:
        assert max_param_gap(fed.secondaries[party], twin.secondaries[party]) < 1e-9
    unpipelined = run_twin(cfg.replace(pipeline=False))
    assert np.abs(fed.losses - unpipelined.losses).max() > 1e-6  # the oracle tells the schedules apart


class Recording(LocalChannel):
    """Records, per request, the gradient blocks the parties have applied when they embed."""

    def __init__(self, parties):
        super().__init__(parties)
        self.applied_at_embed: list[int] = []

    def send(self, apply, embed, save=None, lr_scale=1.0):
        out = super().send(apply, embed, save, lr_scale)
        self.applied_at_embed.append(min(s.applied for s in self.parties.values()))
        return out


@pytest.mark.parametrize("pipeline, lag", [(False, 0), (True, S)])
def test_a_window_sees_embeddings_at_most_one_window_older_when_pipelined(pipeline, lag, tmp_path, monkeypatch):
    """Window w's embeddings come from weights that have applied every step before it
    (unpipelined) or all but the last window's S steps (pipelined, from window 1 on)."""
    channels = []

    def recording(parties):
        channels.append(Recording(parties))
        return channels[-1]

    monkeypatch.setattr("app.vfl.inprocess.LocalChannel", recording)
    cfg = RunConfig.of(
        **CASES["hdb-regression-cnn-dropout"],
        epochs=1,
        max_steps=4 * S,
        steps_per_exchange=S,
        pipeline=pipeline,
        out_dir=str(tmp_path),
    )
    run_in_process(cfg)
    applied = channels[0].applied_at_embed[:4]  # the training windows (the evaluation's exchanges follow)
    steps_before = [w * S for w in range(4)]
    lags = [b - a for a, b in zip(applied, steps_before)]
    assert lags == ([0, S, S, S] if pipeline else [0, 0, 0, 0])
    assert max(lags) == lag
    assert protocol.TrainPlan.__dataclass_fields__["pipeline"].default is False  # exact unless asked


def test_an_exact_windows_exchange_goes_out_before_the_primarys_last_update(tmp_path, monkeypatch):
    """Exact overlap (S = 1, unpipelined): request w + 1 goes out once step w's gradient blocks
    exist, before the primary's update of step w (which changes no block), so the primary has
    made w updates, not w + 1, when it is sent; the run stays its twin's (test_equivalence)."""
    updates, at_send = [0], []
    real = PrimaryParty.update

    def counting(self):
        real(self)
        updates[0] += 1

    class Spy(LocalChannel):
        def send(self, apply, embed, save=None, lr_scale=1.0):
            at_send.append(updates[0])
            return super().send(apply, embed, save, lr_scale)

    monkeypatch.setattr(PrimaryParty, "update", counting)
    monkeypatch.setattr("app.vfl.inprocess.LocalChannel", Spy)
    cfg = RunConfig.of(
        **CASES["hdb-regression-cnn-dropout"], epochs=1, max_steps=5, steps_per_exchange=1, out_dir=str(tmp_path)
    )
    run_in_process(cfg)
    assert at_send == [0, 0, 1, 2, 3] and updates[0] == 5


@pytest.mark.parametrize("s", [1, 10**6])
def test_the_next_epochs_first_window_rides_on_the_evaluations_exchange(s, tmp_path):
    """A deployed exchange costs seconds: the evaluation's exchange also fetches the next epoch's
    first window (no gradient block lies between the two), so an epoch exchanged once (S >= its
    steps) costs one exchange after the first, and the run still equals its twin (1e-9)."""
    from app.modes import run_experiment

    cfg = RunConfig.of(
        **CASES["synthetic-binary-avg"], epochs=3, steps_per_exchange=s, dtype="float64", out_dir=str(tmp_path / "runs")
    )
    summary = run_experiment(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = summary["steps"] // 3
    want = [2, 1, 1] if s > steps else [steps + 1, steps, steps]
    assert [r["exchanges"] for r in rows] == want
    fed, twin = run_in_process(cfg), run_twin(cfg)
    np.testing.assert_allclose(fed.losses, twin.losses, rtol=1e-9, atol=1e-10)
    assert max_param_gap(fed.primary, twin.primary) < 1e-9
