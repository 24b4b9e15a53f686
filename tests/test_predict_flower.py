"""Predict through Flower, piece by piece (the whole: tests/test_flower_run.py and
tests/test_deploy.py). A secondary (app/vfl/client.py) keeps the evaluated state of a best
epoch in its own folder (query.keep) and embeds tokens with it (query.embed_kept), refusing a
misaligned keep, a missing kept model, another linkage job and data that changed since
training, by name; its handlers are called directly, as in tests/test_secondary_security.py.
The primary (app/vfl/predict_server.py) takes the service's answer to its query only for the
run's job and the records it predicts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from flwr.app import Context, Message, RecordDict

from app import messages
from app.config import RunConfig
from app.data import _load, load_data
from app.kept import KeptError
from app.vfl import client as client_app
from app.vfl.linking import linkage_job
from app.vfl.secondary import MisalignedStep, SecondaryParty
from linkage.contracts import LinkageError
from tests.test_byo import write_parties
from tests.test_secondary_security import query

pytestmark = pytest.mark.usefixtures("run_identity")  # tests/conftest.py: a Message needs a run


@pytest.fixture
def party(tmp_path):
    """The csv parties' secondary 'shops' in a simulation, introduced to a job the primary linked."""
    write_parties(tmp_path)
    values = {"dataset": "csv", "data-dir": str(tmp_path), "k": 4, "out-dir": str(tmp_path / "out")}
    cfg = RunConfig.from_flower(values)
    linkage, folder = linkage_job(load_data(cfg), cfg, cfg.resolve())
    ctx = Context(
        run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 1}, state=RecordDict(), run_config=values
    )
    SecondaryParty(cfg, "shops", str(folder)).persist(ctx)
    yield ctx, linkage.job_id, tmp_path
    _load.cache_clear()  # the tests edit the CSVs


ATTEMPT = "a1" * 8  # the run's training attempt (app/kept.py attempt_id)


def keep(ctx, run="r1", epoch=0, applied=0):
    fields = {"run": run, "epoch": epoch, "applied": applied, "attempt": ATTEMPT}
    return client_app.keep(query("query.keep", "keep", fields), ctx)


def embed_kept(ctx, job_id, tokens, run="r1", attempt=ATTEMPT) -> np.ndarray:
    msg = Message(
        messages.kept_embed_content(run, job_id, np.asarray(tokens), attempt),
        dst_node_id=1,
        message_type="query.embed_kept",
    )
    return messages.read_reply(client_app.embed_kept(msg, ctx).content).emb


def test_a_kept_state_embeds_as_the_party_did_when_it_was_kept(party):
    ctx, job_id, root = party
    before = SecondaryParty.restore(RunConfig.from_flower(ctx.run_config), ctx)
    tokens = np.arange(0, 80, 3)
    want = before.embed(tokens)
    keep(ctx)
    assert (root / "out" / "r1" / "shops" / f"kept-{ATTEMPT}.pt").exists()  # its own folder for the run
    with torch.no_grad():  # later training changes the live state, not the kept one
        for p in before.model.parameters():
            p.add_(1.0)
    before.persist(ctx)
    np.testing.assert_array_equal(embed_kept(ctx, job_id, tokens), want)
    # a run kept before attempts were recorded: its party's kept.pt, asked for with no attempt
    folder = root / "out" / "r1" / "shops"
    (folder / f"kept-{ATTEMPT}.pt").rename(folder / "kept.pt")
    np.testing.assert_array_equal(embed_kept(ctx, job_id, tokens, attempt=""), want)


def test_a_keep_after_a_later_step_is_refused_and_writes_nothing(party):
    ctx, _, root = party
    with pytest.raises(MisalignedStep, match="asked to keep epoch 0 after 3 gradient blocks, but it has applied 0"):
        keep(ctx, applied=3)
    assert not (root / "out" / "r1").exists()
    with pytest.raises(messages.ProtocolError, match="plain folder name"):
        keep(ctx, run="../evil")


def test_embedding_without_a_kept_model_or_for_another_job_is_refused(party):
    ctx, job_id, _ = party
    with pytest.raises(KeptError, match="party 'shops' keeps no model for this run"):
        embed_kept(ctx, job_id, [0, 1])
    keep(ctx)
    with pytest.raises(LinkageError, match="no linkage for party 'shops'"):
        embed_kept(ctx, "0" * 16, [0, 1])  # a job this party does not hold
    with pytest.raises(ValueError, match="token out of range"):
        embed_kept(ctx, job_id, [0, 80])


def test_a_party_whose_data_changed_since_training_refuses_to_embed(party):
    ctx, job_id, root = party
    keep(ctx)
    shops = pd.read_csv(root / "shops.csv")
    shops.loc[5, "rent"] += 1.0
    shops.to_csv(root / "shops.csv", index=False)
    _load.cache_clear()  # a predict is a new process: it reads the CSVs again
    with pytest.raises(KeptError, match="party 'shops': its data changed since training"):
        embed_kept(ctx, job_id, [0, 1])


# ---------------------------------------------------------------------------- the primary's linkage


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory):
    from app.modes import run_experiment
    from app.vfl.predict import open_kept

    root = tmp_path_factory.mktemp("kept")
    write_parties(root)
    cfg = RunConfig.of(dataset="csv", data_dir=str(root), k=4, epochs=1, batch_size=64, out_dir=str(root / "out"))
    run_experiment(cfg, root / "out" / "r1")
    return cfg, open_kept(root / "out" / "r1"), root


def test_the_primary_takes_the_services_answer_only_for_its_job_and_its_records(kept_run):
    import dataclasses

    from app.vfl.predict import link_here
    from app.vfl.predict_server import _linkage
    from linkage.binding import identifier_digest
    from linkage.store import primary_bytes

    cfg, kept, root = kept_run
    ids = kept.ds.primary.identifiers[:20]
    here = link_here(kept, ids, {})
    answer = root / "answer.npz"
    asked = cfg.replace(predict_run="r1", predict_input="new.csv", predict_output="p.csv", predict_linkage=str(answer))

    def served(linkage) -> dict:
        answer.write_bytes(primary_bytes(linkage))
        return {}

    served(dataclasses.replace(here, ids_sha256=identifier_digest(ids)))
    got = _linkage(asked, kept, ids, {})
    np.testing.assert_array_equal(got.links["shops"].tokens, here.links["shops"].tokens)
    with pytest.raises(KeptError, match="queried with other identifiers"):
        _linkage(asked, kept, kept.ds.primary.identifiers[20:40], {})
    served(dataclasses.replace(here, job_id="0" * 16, ids_sha256=identifier_digest(ids)))
    with pytest.raises(KeptError, match="answers linkage job 0000000000000000, but run 'r1' was trained on job"):
        _linkage(asked, kept, ids, {})
    served(here)  # no digest: cannot be bound to these records
    with pytest.raises(KeptError, match="queried with other identifiers"):
        _linkage(asked, kept, ids, {})


@pytest.mark.parametrize("value,dtype", [(1e300, np.float64), (3.4e38, np.float32), (0.5, np.float64)])
def test_predict_refuses_a_secondarys_poisoned_kept_embeddings_naming_it(kept_run, monkeypatch, value, dtype):
    """Kept embeddings are held to what training held them to (strategies/wire_checks.py): exactly
    (T, c) in the run's dtype, finite, within the bound. A hostile secondary's float64 1e300 or
    float32 3.4e38 of the right shape passed, became inf in the run's float32 and was written as
    NaN or arbitrary predictions, the command exiting 0."""
    import app.vfl.predict_server as predict_server
    from app.vfl.channel import FlowerChannel
    from strategies.vfl.wire import StepReply
    from strategies.wire_checks import PeerValueError

    cfg, kept, root = kept_run
    pd.read_csv(root / "sales.csv").drop(columns=["price"]).head(20).to_csv(root / "new.csv", index=False)
    cut = kept.settings.model.cut_dim

    def hostile(self, message_type, contents):  # every party answers finite values of the right shape
        tokens = {p: messages.read_kept_embed(c)[1] for p, c in contents.items()}
        return {
            p: messages.reply_content(StepReply(np.full((len(t), cut), value, dtype=dtype))) for p, t in tokens.items()
        }

    monkeypatch.setattr(
        predict_server, "handshake", lambda grid, parties, *a, **k: {p: i + 1 for i, p in enumerate(parties)}
    )
    monkeypatch.setattr(FlowerChannel, "_exchange", hostile)
    out = root / f"p-{np.dtype(dtype).name}-{value:g}.csv"
    asked = cfg.replace(predict_run="r1", predict_input=str(root / "new.csv"), predict_output=str(out))
    with pytest.raises(PeerValueError, match=r"the primary: embeddings from party '\w+' in query\.embed_kept"):
        predict_server.run_predict(None, asked)
    assert not out.exists()
