"""Predict through Flower holds a secondary's kept embeddings to what training held them to
(strategies/wire_checks.py): exactly (T, c) in the run's dtype, finite, within the bound. A
hostile secondary's float64 1e300 or float32 3.4e38 passed the shape check, became inf in the
run's float32 and was written as NaN or arbitrary predictions, the command exiting 0."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import app.vfl.predict_server as predict_server
from app import messages
from app.config import RunConfig
from app.modes import run_experiment
from app.vfl.channel import FlowerChannel
from app.vfl.predict import open_kept
from strategies.vfl.wire import StepReply
from strategies.wire_checks import PeerValueError
from tests.test_byo import write_parties


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("kept")
    write_parties(work)
    cfg = RunConfig.of(dataset="csv", data_dir=str(work), k=4, epochs=1, batch_size=64, out_dir=str(work / "out"))
    run_experiment(cfg, work / "out" / "r1")
    pd.read_csv(work / "sales.csv").drop(columns=["price"]).head(20).to_csv(work / "new.csv", index=False)
    return work, cfg, open_kept(work / "out" / "r1").settings.model.cut_dim


@pytest.mark.parametrize("value,dtype", [(1e300, np.float64), (3.4e38, np.float32), (0.5, np.float64)])
def test_predict_refuses_a_secondarys_poisoned_kept_embeddings_naming_it(trained, monkeypatch, value, dtype):
    work, cfg, cut = trained

    def hostile(self, message_type, contents):  # every party answers finite values of the right shape
        out = {}
        for p, content in contents.items():
            tokens = messages.read_kept_embed(content)[2]
            out[p] = messages.reply_content(StepReply(np.full((len(tokens), cut), value, dtype=dtype)))
        return out

    monkeypatch.setattr(
        predict_server, "handshake", lambda grid, parties, *a, **k: {p: i + 1 for i, p in enumerate(parties)}
    )
    monkeypatch.setattr(FlowerChannel, "_exchange", hostile)
    out = work / f"p-{np.dtype(dtype).name}-{value:g}.csv"
    asked = cfg.replace(predict_run="r1", predict_input=str(work / "new.csv"), predict_output=str(out))
    with pytest.raises(PeerValueError, match=r"the primary: embeddings from party '\w+' in query\.embed_kept"):
        predict_server.run_predict(None, asked)
    assert not out.exists()
