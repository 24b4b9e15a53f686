"""A secondary's model and optimiser survive the trip through context.state exactly."""

import numpy as np
import torch
from flwr.app import Context, RecordDict

from app.config import RunConfig
from app.data import load_data
from app.vfl.linking import linkage_job
from app.vfl.secondary import SecondaryParty
from strategies.vfl.wire import GradBlock


def test_state_round_trip_continues_training_exactly(tmp_path):
    cfg = RunConfig.of(dataset="hdb", n_rows=600, k=10, out_dir=str(tmp_path))
    ds = load_data(cfg)
    _, job = linkage_job(ds, cfg, cfg.resolve())
    rng = np.random.default_rng(0)
    blocks = []
    for _ in range(4):
        tokens = np.sort(rng.choice(165, size=30, replace=False))
        blocks.append(GradBlock(tokens, rng.normal(size=(30, 100)).astype(np.float32)))

    straight = SecondaryParty(cfg, "school", str(job))
    straight.apply(blocks)  # four steps in one object

    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    party = SecondaryParty(cfg, "school", str(job))
    party.persist(ctx)
    for block in blocks:  # one message per step: restore, step, persist
        party = SecondaryParty.restore(cfg, ctx)
        party.apply([block])
        party.persist(ctx)
    final = SecondaryParty.restore(cfg, ctx)
    for key, value in straight.model.state_dict().items():
        torch.testing.assert_close(final.model.state_dict()[key], value, rtol=0, atol=0)
    tokens = np.arange(165)
    np.testing.assert_array_equal(final.embed(tokens), straight.embed(tokens))
    assert not np.allclose(final.embed(tokens), SecondaryParty(cfg, "school", str(job)).embed(tokens))
