"""A training step reads nothing back to the host on the primary's path (issue 31): its loss
stays on the device until the protocol reads the losses in bulk, its gradient blocks and the
in-process secondaries' embeddings stay tensors. Counted by patching every Python-level way a
tensor's value reaches the host, during the steps of a tiny in-process run with S > 1."""

import os
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from app.config import RunConfig
from strategies.schedule import epoch_batches

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__", "__array__")


def _counting(monkeypatch) -> Counter:
    """Every host read from now on, by (file, function) of its caller."""
    reads: Counter = Counter()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, _original=original, **kwargs):
            frame = sys._getframe(1)
            reads[(os.path.basename(frame.f_code.co_filename), frame.f_code.co_name)] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return reads


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("steps_per_exchange", [1, 4])
def test_the_steps_read_nothing_back_but_the_losses_once(steps_per_exchange, device, tmp_path, monkeypatch):
    """16 steps: the primary reads its losses once (at the epoch's end); the secondaries' replay
    reads one finiteness flag per exchange that delivers blocks; nothing else is read, nothing
    per step. The code before the step's speed-up read the loss, each gradient block (.cpu, .numpy) and each
    block's finiteness at every step."""
    from app.vfl.inprocess import _local_parties, _setup  # the run's pieces, as run_in_process builds them
    from app.vfl.parties import build_strategy  # the primary's strategy, as the apps build it
    from strategies.vfl.channel import LocalChannel  # the in-process secondaries
    from strategies.vfl.protocol import Exchange, train_epoch  # the code under test

    cfg = RunConfig.of(
        dataset="hdb",
        n_rows=1000,
        k=8,
        batch_size=32,
        epochs=1,
        method="fedsim_attn",
        device=device,
        out_dir=str(tmp_path),
    )
    cfg, settings, ds, linkage, job, plan = _setup(cfg, steps_per_exchange)
    strategy = build_strategy(ds, linkage, cfg, settings)
    channel = LocalChannel(_local_parties(cfg, ds, job, linkage))
    batches = epoch_batches(ds.split.train, plan.batch_size, plan.seed, 0)[:16]
    losses: list[float] = []
    reads = _counting(monkeypatch)
    train_epoch(Exchange(strategy, channel, plan), batches, losses, lambda *a: None)
    monkeypatch.undo()
    assert len(losses) == 16 and np.isfinite(losses).all()
    exchanges_with_blocks = 16 // steps_per_exchange - 1  # the last window's blocks go with the evaluation
    # the secondary's one read per exchange: its blocks' finiteness, checked before any is applied
    assert dict(reads) == {("protocol.py", "train_epoch"): 1, ("secondary.py", "_checked"): exchanges_with_blocks}


@pytest.mark.parametrize("n", [40, 100_000])
def test_distinct_is_np_unique_with_its_inverse(n):
    """Both ways (marks for a small token space, a sort for a large one) give np.unique's arrays."""
    from strategies.vfl.primary import distinct  # lazy: this module's first test also runs on the tree before it

    values = np.random.default_rng(n).integers(0, n, size=(128, 50))
    uniq, inverse = distinct(values, n)
    want, want_inverse = np.unique(values, return_inverse=True)
    np.testing.assert_array_equal(uniq, want)
    np.testing.assert_array_equal(inverse, want_inverse.reshape(values.shape))
    np.testing.assert_array_equal(uniq[inverse], values)
