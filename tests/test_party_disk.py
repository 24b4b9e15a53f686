"""A primary cannot fill a secondary's disk with run folders: a deployed party keeps at most its
node config's max-runs (32) runs' folders in each folder of its own, refusing the next run name."""

from __future__ import annotations

import pytest
from flwr.app import Context, RecordDict

from app.config import RunConfig
from app.messages import ProtocolError
from app.node import MAX_RUNS, checkpoint_dir, model_dir


def _deployed(tmp_path, **extra) -> Context:
    config = {"party": "school", "checkpoint-dir": str(tmp_path / "ckpt"), **extra}
    return Context(run_id=1, node_id=1, node_config=config, state=RecordDict(), run_config={})


def test_a_party_keeps_at_most_max_runs_run_folders_for_the_primary(tmp_path):
    ctx, cfg = _deployed(tmp_path), RunConfig.of()
    for i in range(MAX_RUNS):
        checkpoint_dir(cfg, ctx, f"run{i}", "school").mkdir(parents=True)
    assert checkpoint_dir(cfg, ctx, "run0", "school").exists()  # a run it keeps already: still its folder
    for where in (checkpoint_dir, model_dir):
        with pytest.raises(ProtocolError, match=f"already holds {MAX_RUNS} runs' folders.*max-runs"):
            where(cfg, ctx, "one-more", "school")
    assert len(list((tmp_path / "ckpt").iterdir())) == MAX_RUNS
    raised = _deployed(tmp_path, **{"max-runs": MAX_RUNS + 1})
    assert checkpoint_dir(cfg, raised, "one-more", "school").parent.name == "one-more"
