"""A rerun over a finished run that fails never changes what the finished run predicts.

Through Flower each secondary keeps the state of the best epoch in its own folder (deployed: on its
own host, which the primary's set-aside of a finished run cannot reach; simulated: in the run's
folder, beside what the primary sets aside). A rerun under the same name keeps its own best epochs
as it goes; when it fails, the finished run is put back (app/run_status.py) and predict must still
embed with the states the finished run kept, not the failed attempt's. The primary's channel
(app/vfl/channel.py, app/entity_aug/channel.py) drives the real ClientApp handlers here, in this
process, over a grid that calls them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, RecordDict

from app import run_status
from app.config import RunConfig
from app.kept import drop_other_attempts, kept_attempt, party_kept_file, party_model_file
from app.vfl import client as client_app
from app.vfl.channel import FlowerChannel
from app.vfl.secondary import SecondaryParty
from strategies.wire_checks import ProtocolError
from tests.test_predict_flower import party  # noqa: F401 - the fixture: the csv parties' 'shops', simulated

pytestmark = pytest.mark.usefixtures("run_identity")  # tests/conftest.py: a Message needs a run

HANDLERS = {
    "query.keep": client_app.keep,
    "query.embed_kept": client_app.embed_kept,
    "query.finish": client_app.finish,
    "train.step": client_app.step,
}


class HandlerGrid:
    """Nodes whose ClientApp handlers run here, each with its own context."""

    def __init__(self, contexts: dict[int, object], handlers: dict) -> None:
        self.contexts, self.handlers, self.sent = contexts, handlers, {}

    def push_messages(self, msgs):
        ids = [f"m{len(self.sent) + i}" for i in range(len(msgs))]
        self.sent.update(zip(ids, msgs))
        return ids

    def pull_messages(self, ids):
        out = []
        for i in ids:
            msg = self.sent.pop(i, None)
            if msg is None:
                continue
            node = msg.metadata.dst_node_id
            reply = self.handlers[msg.metadata.message_type](msg, self.contexts[node])
            out.append(
                SimpleNamespace(
                    has_error=lambda: False,
                    content=reply.content,
                    metadata=SimpleNamespace(reply_to_message_id=i, src_node_id=node),
                )
            )
        return out


def _move_weights(ctx) -> None:
    """What the rerun's steps do to the party's model before its first best epoch."""
    cfg = RunConfig.from_flower(ctx.run_config)
    secondary = SecondaryParty.restore(cfg, ctx)
    with torch.no_grad():
        for p in secondary.model.parameters():
            p.add_(0.5)
    secondary.persist(ctx)


def _finished_run(run_dir, keep) -> None:
    status = run_status.RunStatus(run_dir, "flower")
    with status.recording():
        status.start()
        keep()
        (run_dir / "summary.json").write_text("{}")


def _failed_rerun(run_dir, keep) -> None:
    status = run_status.RunStatus(run_dir, "flower")
    with pytest.raises(RuntimeError, match="the rerun fails"):
        with status.recording():
            status.start()
            keep()
            raise RuntimeError("the rerun fails after keeping its first best epoch")
    assert run_status.is_finished(run_dir) and (run_dir / run_status.LAST_ATTEMPT).exists()


def test_a_failed_rerun_leaves_what_the_finished_vfl_run_predicts(party):  # noqa: F811 - the fixture
    ctx, job_id, root = party
    run_dir = root / "out" / "r1"
    channel = FlowerChannel(HandlerGrid({1: ctx}, HANDLERS), {"shops": 1}, timeout=5, job_id=job_id)
    tokens = {"shops": np.arange(0, 80, 3)}

    def keep(epoch, on_a_step):
        channel.keep(run_dir, epoch)
        if on_a_step:  # the keep rides on the next step (train.step), else it goes alone (query.keep)
            channel.step({"shops": []}, tokens)
        channel.flush_keep()

    _finished_run(run_dir, lambda: keep(1, on_a_step=False))
    attempt = kept_attempt(run_dir)
    before = channel.embed_kept("r1", tokens, attempt)["shops"]
    _move_weights(ctx)
    _failed_rerun(run_dir, lambda: keep(0, on_a_step=True))
    after = channel.embed_kept("r1", tokens, kept_attempt(run_dir))["shops"]
    np.testing.assert_array_equal(after, before)  # the finished run's kept state, not the attempt's
    assert len(list((run_dir / "shops").glob("kept*.pt"))) == 2  # the finished run's and the failed attempt's

    failed = {p.name for p in (run_dir / "shops").glob("kept*.pt")} - {party_kept_file(attempt)}

    def finish():  # a later rerun that finishes: its kept state and the run it replaces stay, the failed one's goes
        keep(2, on_a_step=False)
        channel.finish(str(run_dir))

    _finished_run(run_dir, finish)
    kept = {p.name for p in (run_dir / "shops").glob("kept*.pt")}
    assert kept == {party_kept_file(kept_attempt(run_dir)), party_kept_file(attempt)} and not kept & failed
    _finished_run(run_dir, finish)  # and the next: only its own and the one it replaces
    assert {p.name for p in (run_dir / "shops").glob("kept*.pt")} == {party_kept_file(kept_attempt(run_dir))} | (
        kept - {party_kept_file(attempt)}
    )


def test_a_failed_rerun_leaves_what_the_finished_entity_augmentation_run_predicts(tmp_path):
    from app.entity_aug import client as ea_client
    from app.entity_aug.channel import FlowerChannel as EAChannel
    from app.entity_aug.parties import request_content
    from strategies.entity_aug.channel import StepRequest
    from tests.test_ea_secondary_security import EA_RUN
    from tests.test_secondary_security import query

    values = {**EA_RUN, "out-dir": str(tmp_path / "out")}
    ctx = Context(
        run_id=1, node_id=1, node_config={"partition-id": 1, "num-partitions": 2}, state=RecordDict(), run_config=values
    )
    ea_client.hello(query("query.ea_hello", "ea_hello", {}), ctx)
    handlers = {"query.ea_keep": ea_client.keep, "query.ea_embed_kept": ea_client.embed_kept}
    channel = EAChannel(HandlerGrid({1: ctx}, handlers), {"right": 1}, 5.0, {})
    run_dir, ids = tmp_path / "out" / "r1", np.arange(0, 40, 2)

    _finished_run(run_dir, lambda: channel.keep(str(run_dir), 1))
    before = channel.embed_kept("r1", ids, kept_attempt(run_dir))["right"]
    step = Message(request_content(StepRequest(0, 0, None)), dst_node_id=1, message_type="train.ea_step")
    ea_client.step(step, ctx)  # the rerun trains on: its first step
    grad = Message(
        request_content(StepRequest(0, 1, np.ones((64, before.shape[1]), np.float32))),
        dst_node_id=1,
        message_type="train.ea_step",
    )
    ea_client.step(grad, ctx)  # and applies a gradient: the secondary's weights move
    _failed_rerun(run_dir, lambda: channel.keep(str(run_dir), 0))
    after = channel.embed_kept("r1", ids, kept_attempt(run_dir))["right"]
    np.testing.assert_array_equal(after, before)  # the finished run's kept state, not the attempt's


def test_a_rerun_that_fails_after_its_finish_leaves_the_finished_runs_kept_states(party):  # noqa: F811 - the fixture
    """A rerun's finish reaches the secondaries before the run is marked finished (its manifest,
    report and summary come after): a failure there puts the finished run back, whose secondaries'
    kept states must still be there."""
    ctx, job_id, root = party
    run_dir = root / "out" / "r1"
    channel = FlowerChannel(HandlerGrid({1: ctx}, HANDLERS), {"shops": 1}, timeout=5, job_id=job_id)
    tokens = {"shops": np.arange(0, 80, 3)}

    def keep_and_finish(epoch):
        channel.keep(run_dir, epoch)
        channel.finish(str(run_dir))

    _finished_run(run_dir, lambda: keep_and_finish(1))
    before = channel.embed_kept("r1", tokens, kept_attempt(run_dir))["shops"]
    final = run_dir / "shops" / party_model_file(kept_attempt(run_dir))  # the party's final state, as finished
    final_bytes = final.read_bytes()
    _move_weights(ctx)
    _failed_rerun(run_dir, lambda: keep_and_finish(0))
    after = channel.embed_kept("r1", tokens, kept_attempt(run_dir))["shops"]
    np.testing.assert_array_equal(after, before)
    assert final.read_bytes() == final_bytes  # not the failed attempt's final state
    assert len(list((run_dir / "shops").glob("model*.pt"))) == 2  # its and the failed attempt's, until a rerun finishes


def test_keeps_under_ever_new_attempt_names_do_not_fill_the_secondarys_disk(party):  # noqa: F811 - the fixture
    """A primary naming a new attempt at every keep: the party holds the kept states of at most the
    keep's attempt and the one it names as the finished run it would replace (and an old kept.pt)."""
    from tests.test_secondary_security import query

    ctx, _, root = party
    for i in range(20):
        fields = {"run": "r1", "epoch": 0, "applied": 0, "attempt": f"{i:016x}", "previous": f"{i + 100:016x}"}
        client_app.keep(query("query.keep", "keep", fields), ctx)
    assert sorted(p.name for p in (root / "out" / "r1" / "shops").glob("kept*.pt")) == [f"kept-{19:016x}.pt"]
    for name in ("a19", "../x", "ABCDEF0123456789", "0" * 17):  # only an attempt's id names a file
        fields = {"run": "r1", "epoch": 0, "applied": 0, "attempt": name}
        with pytest.raises(ProtocolError, match="attempt"):
            client_app.keep(query("query.keep", "keep", fields), ctx)
    assert sorted(p.name for p in (root / "out" / "r1" / "shops").glob("kept*.pt")) == [f"kept-{19:016x}.pt"]


def test_only_attempts_states_are_dropped_and_a_finished_runs_final_model_pt_stays(tmp_path):
    """A run finished before the final state was named for its attempt wrote model.pt: a rerun's
    keep must not delete it (the rerun may fail and put that run back); nor a file the party's
    operator put in the folder."""
    a, b = "a" * 16, "b" * 16
    for name in (f"kept-{a}.pt", "model.pt", "model-backup.pt", "kept-old.pt", f"kept-{b}.pt", f"model-{'c' * 16}.pt"):
        (tmp_path / name).write_text(name)
    drop_other_attempts(tmp_path, {"attempt": b, "previous": a})
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([f"kept-{a}.pt", f"kept-{b}.pt", "model.pt", "model-backup.pt", "kept-old.pt"]), left
