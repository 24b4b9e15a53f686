"""A secondary reads and writes only under its own folders, whatever a message says, and
refuses non-finite tensors; the primary refuses non-finite embeddings (issue 13, item 5);
Entity Augmentation's parties alike: tests/test_ea_secondary_security.py.

The ClientApp handlers are called directly with hand-made Flower messages and contexts: a
deployed party (node config "party" + its own folders) and a simulated one (node config
partition-id only; its folders come from the run config)."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict

from app import messages
from app.config import RunConfig
from app.data import load_data
from app.vfl import client as client_app
from app.vfl.channel import FlowerChannel
from app.vfl.linking import linkage_job
from app.vfl.secondary import MisalignedStep, SecondaryParty
from strategies.vfl.wire import GradBlock

RUN = {"dataset": "hdb", "n-rows": 600, "k": 10}


pytestmark = pytest.mark.usefixtures("run_identity")  # tests/conftest.py: a Message needs a run


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A linkage job linked by the primary into its out-dir (as a simulation does)."""
    out = tmp_path_factory.mktemp("primary-out")
    cfg = RunConfig.from_flower({**RUN, "out-dir": str(out)})
    linkage, folder = linkage_job(load_data(cfg), cfg, cfg.resolve())
    return SimpleNamespace(id=linkage.job_id, folder=folder, out=out, cfg=cfg)


def deployed(tmp_path, job) -> tuple[Context, dict]:
    """A deployed party 'school' with its own folders; the run config (the primary's) names others."""
    own = tmp_path / "school-host"
    (own / "linkage").mkdir(parents=True)
    shutil.copy(job.folder / "secondary-school.npz", own / "linkage")
    node = {
        "party": "school",
        "linkage-dir": str(own / "linkage"),
        "checkpoint-dir": str(own / "ckpt"),
        "model-dir": str(own / "models"),
    }
    run_config = {**RUN, "out-dir": str(tmp_path / "primary-chosen"), "linkage-dir": str(job.folder)}
    ctx = Context(run_id=1, node_id=1, node_config=node, state=RecordDict(), run_config=run_config)
    return ctx, {"checkpoint": own / "ckpt" / "{run}" / "school", "model": own / "models" / "{run}" / "school"}


def simulated(tmp_path, job) -> tuple[Context, dict]:
    """A simulated party: one operator plays every party, its folders are the run config's out-dir."""
    ctx = Context(
        run_id=1,
        node_id=1,
        node_config={"partition-id": 0, "num-partitions": 1},
        state=RecordDict(),
        run_config={**RUN, "out-dir": str(job.out)},
    )
    return ctx, {"checkpoint": job.out / "{run}" / "checkpoint" / "school", "model": job.out / "{run}" / "school"}


CONTEXTS = {"deployed": deployed, "simulated": simulated}


def introduce(ctx: Context, job) -> SecondaryParty:
    """The party as after its hello (its own linkage copy in deployment)."""
    folder = ctx.node_config.get("linkage-dir", str(job.folder))
    party = SecondaryParty(job.cfg, "school", str(folder))
    party.persist(ctx)
    return party


def refused(call) -> Exception | None:
    """The exception ``call`` raised, or None: assertions on what was written come first."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the caller checks its type
        return e
    return None


def names(err: Exception | None, *pieces: str) -> bool:
    """``err`` is a NonFiniteValues error naming every piece (party, message, tensor, count)."""
    assert isinstance(err, messages.NonFiniteValues), err
    assert all(p in str(err) for p in pieces), (str(err), pieces)
    return True


def query(kind: str, record: str, values: dict) -> Message:
    return Message(RecordDict({record: ConfigRecord(values)}), dst_node_id=1, message_type=kind)


def files_under(folder) -> list:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def weights(ctx: Context) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in SecondaryParty.restore(job_cfg(ctx), ctx).model.state_dict().items()}


def job_cfg(ctx: Context) -> RunConfig:
    from app.node import node_run_config

    return node_run_config(ctx)


# ---------------------------------------------------------------------------- paths


@pytest.mark.parametrize("where", sorted(CONTEXTS))
def test_finish_writes_the_model_only_under_the_partys_own_folder(where, tmp_path, job):
    ctx, own = CONTEXTS[where](tmp_path, job)
    introduce(ctx, job)
    evil = tmp_path / "evil"
    err = refused(lambda: client_app.finish(query("query.finish", "finish", {"folder": str(evil), "run": "r1"}), ctx))
    assert files_under(evil) == [], "the primary's message chose where the party wrote"
    assert isinstance(err, messages.ProtocolError) and "'folder'" in str(err), err
    for run in ("../../../evil", "a/b", "..", "", "x\\y"):
        with pytest.raises(messages.ProtocolError, match="plain folder name"):
            client_app.finish(query("query.finish", "finish", {"run": run}), ctx)
    assert files_under(evil) == [] and files_under(tmp_path / "primary-chosen") == []
    client_app.finish(query("query.finish", "finish", {"run": "r1"}), ctx)
    model = torch.load(str(own["model"]).format(run="r1") + "/model.pt", weights_only=True)
    assert set(model) == set(SecondaryParty.restore(job_cfg(ctx), ctx).model.state_dict())
    assert files_under(evil) == [] and files_under(tmp_path / "primary-chosen") == []


@pytest.mark.parametrize("where", sorted(CONTEXTS))
def test_checkpoints_are_saved_and_restored_only_under_the_partys_own_folder(where, tmp_path, job):
    ctx, own = CONTEXTS[where](tmp_path, job)
    party = introduce(ctx, job)
    evil = tmp_path / "evil"
    tokens = np.arange(5)
    run = f"r-{where}"

    def step_msg(**save) -> Message:
        content = messages.step_content(messages.StepRequest.build([], tokens, party.job_id, 0))
        content.config_records["meta"] = ConfigRecord({**content.config_records["meta"], **save})
        return Message(content, dst_node_id=1, message_type="train.step")

    err = refused(lambda: client_app.step(step_msg(save_folder=str(evil), save_run=run, save_epoch=0), ctx))
    assert files_under(evil) == [], "the primary's message chose where the party wrote"
    assert isinstance(err, messages.ProtocolError) and "'save_folder'" in str(err), err
    reply = client_app.step(step_msg(save_run=run, save_epoch=0), ctx)
    saved = messages.read_reply(reply.content).state
    folder = type(tmp_path)(str(own["checkpoint"]).format(run=run))
    assert [p.name for p in files_under(folder)] == ["epoch-0.pt"] and saved["epoch"] == 0

    with pytest.raises(messages.ProtocolError, match="'folder'"):
        client_app.restore(query("query.restore", "state", {"folder": str(evil), "run": run, "epoch": 0}), ctx)
    with pytest.raises(messages.ProtocolError, match="plain folder name"):
        client_app.restore(query("query.restore", "state", {"run": "../" + run, "epoch": 0}), ctx)
    got = client_app.restore(query("query.restore", "state", {"run": run, "epoch": 0}), ctx)
    assert str(got.content.config_records["state"]["digest"]) == saved["digest"]
    assert files_under(evil) == [] and files_under(tmp_path / "primary-chosen") == []


@pytest.mark.parametrize("where", sorted(CONTEXTS))
def test_hello_reads_the_linkage_only_from_the_partys_own_folder(where, tmp_path, job):
    ctx, _ = CONTEXTS[where](tmp_path, job)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(job.folder, elsewhere)
    err = refused(
        lambda: client_app.hello(query("query.hello", "hello", {"job_dir": str(elsewhere), "job_id": job.id}), ctx)
    )
    assert "party" not in ctx.state.config_records, "introduced from a folder the primary's message chose"
    assert isinstance(err, messages.ProtocolError) and "'job_dir'" in str(err), err
    with pytest.raises(messages.ProtocolError, match="plain folder name"):
        client_app.hello(query("query.hello", "hello", {"job_id": f"../{job.id}"}), ctx)
    assert "party" not in ctx.state.config_records  # not introduced by a refused hello
    reply = client_app.hello(query("query.hello", "hello", {"job_id": job.id}), ctx)
    assert reply.content.config_records["hello"]["party"] == "school"
    held = ctx.state.config_records["party"]["job_dir"]
    assert held == ctx.node_config.get("linkage-dir", str(job.folder))


def test_a_deployed_party_refuses_a_hello_for_another_linkage_job(tmp_path, job):
    ctx, _ = deployed(tmp_path, job)
    with pytest.raises(MisalignedStep, match=f"party 'school' holds linkage job '{job.id}'.*'other-job'"):
        client_app.hello(query("query.hello", "hello", {"job_id": "other-job"}), ctx)


def test_a_deployed_party_reads_its_data_from_its_own_config_not_the_run_config(tmp_path, job):
    ctx, _ = deployed(tmp_path, job)
    ctx.run_config["data-dir"] = str(tmp_path / "primary-chosen-data")
    assert (
        job_cfg(ctx).data.data_dir == "" and job_cfg(ctx).link.linkage_dir == "" and job_cfg(ctx).runtime.out_dir == ""
    )
    ctx.node_config["data-dir"] = str(tmp_path / "own-data")
    assert job_cfg(ctx).data.data_dir == str(tmp_path / "own-data")


# ---------------------------------------------------------------------------- non-finite tensors


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "float32-overflow"])
def test_a_non_finite_gradient_is_refused_and_the_weights_stay_intact(bad, tmp_path, job):
    ctx, _ = simulated(tmp_path, job)
    party = introduce(ctx, job)
    before = weights(ctx)
    rng = np.random.default_rng(0)
    tokens = np.arange(0, 40, 2)
    good = GradBlock(tokens, rng.normal(size=(20, 100)).astype(np.float32))
    grad = rng.normal(size=(20, 100))
    grad[[3, 7, 11], [0, 5, 9]] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "float32-overflow": 1e300}[bad]
    grad = grad if bad == "float32-overflow" else grad.astype(np.float32)
    content = messages.step_content(
        messages.StepRequest.build([good, GradBlock(tokens, grad)], tokens, party.job_id, 0)
    )
    err = refused(lambda: client_app.step(Message(content, dst_node_id=1, message_type="train.step"), ctx))
    after = weights(ctx)
    assert all(torch.isfinite(v).all() for v in after.values()), "a non-finite gradient reached the weights"
    assert all(torch.equal(before[k], after[k]) for k in before)
    # a float64 block is refused for its dtype before any cast (1e300 would be inf as float32)
    kind, piece = (ValueError, "dtype float64, expected float32") if bad == "float32-overflow" else (None, "3 of 2000")
    assert isinstance(err, kind or messages.NonFiniteValues), err
    assert all(p in str(err) for p in ("party 'school'", "train.step", "gradient block 1", "the primary", piece)), err
    direct = SecondaryParty.restore(job_cfg(ctx), ctx)  # the party object itself refuses it too
    with pytest.raises(kind or messages.NonFiniteValues, match="party 'school'.*gradient block 1"):
        direct.apply([good, GradBlock(tokens, grad)])
    assert direct.applied == 0 and all(torch.equal(before[k], v) for k, v in direct.model.state_dict().items())
    # the same step without the bad block is applied
    client_app.step(
        Message(
            messages.step_content(messages.StepRequest.build([good], tokens, party.job_id, 0)),
            dst_node_id=1,
            message_type="train.step",
        ),
        ctx,
    )
    assert any(not torch.equal(before[k], v) for k, v in weights(ctx).items())


def test_a_misshapen_gradient_block_changes_no_weight(tmp_path, job):
    """A later block of the wrong shape must not leave the earlier blocks applied."""
    ctx, _ = simulated(tmp_path, job)
    introduce(ctx, job)
    direct = SecondaryParty.restore(job_cfg(ctx), ctx)
    before = {k: v.clone() for k, v in direct.model.state_dict().items()}
    rng = np.random.default_rng(0)
    tokens = np.arange(0, 40, 2)
    good = GradBlock(tokens, rng.normal(size=(20, 100)).astype(np.float32))
    with pytest.raises(ValueError, match=r"party 'school': gradient block 1 .*shape \(20, 7\), expected \(20, 100\)"):
        direct.apply([good, GradBlock(tokens, rng.normal(size=(20, 7)).astype(np.float32))])
    assert direct.applied == 0 and all(torch.equal(before[k], v) for k, v in direct.model.state_dict().items())


class EmbeddingGrid:
    """Nodes that answer every train.step with the given embeddings."""

    def __init__(self, emb: dict[int, np.ndarray]) -> None:
        self.emb, self.sent = emb, {}

    def push_messages(self, msgs):
        ids = [f"m{i}" for i in range(len(msgs))]
        self.sent = dict(zip(ids, msgs))
        return ids

    def pull_messages(self, ids):
        return [
            SimpleNamespace(
                has_error=lambda: False,
                content=messages.reply_content(messages.StepReply(self.emb[m.metadata.dst_node_id])),
                metadata=SimpleNamespace(reply_to_message_id=i, src_node_id=m.metadata.dst_node_id),
            )
            for i, m in self.sent.items()
            if i in ids
        ]


def test_the_primary_refuses_a_non_finite_embedding():
    good = np.ones((4, 3), np.float32)
    bad = good.copy()
    bad[1, 2], bad[3, 0] = np.nan, np.inf
    channel = FlowerChannel(EmbeddingGrid({11: good, 12: bad}), {"a": 11, "b": 12}, timeout=5, job_id="j")
    embed = {"a": np.arange(4), "b": np.arange(4)}
    err = refused(lambda: channel.step({"a": [], "b": []}, embed))
    assert err is not None, "a NaN embedding was accepted"
    assert isinstance(err, messages.NonFiniteValues), err
    assert names(err, "party 'b'", "train.step", "embeddings", "2 of 12")
    ok = FlowerChannel(EmbeddingGrid({11: good, 12: good}), {"a": 11, "b": 12}, timeout=5, job_id="j")
    assert set(ok.step({"a": [], "b": []}, embed)) == {"a", "b"}


# ---------------------------------------------------------------------------- torch.load


def test_every_torch_load_in_the_repo_says_weights_only_true():
    """A pickle in a checkpoint or model file must never run code: torch.load is always explicit."""
    import ast
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    loose = []
    for folder in ("app", "strategies", "linkage_server", "datasets", "bench", "scripts", "tests"):
        for path in sorted((repo / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "load"
                    and "torch" in ast.unparse(node.func.value)
                ):
                    kw = {k.arg: k.value for k in node.keywords}
                    if not (isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True):
                        loose.append(f"{path.relative_to(repo)}:{node.lineno}")
    assert loose == [], f"torch.load without weights_only=True at {loose}"


def test_a_workers_step_that_fails_after_applying_its_blocks_leaves_no_party_holding_them(
    tmp_path, job, monkeypatch, run_identity
):
    """The direct transport's worker keeps its party in memory (app/party_worker.py LiveContext): a
    step whose checkpoint or embedding fails after its blocks were applied must not leave that
    party to answer the next step as if the failed one had not happened."""
    from app.party_worker import LiveContext

    ctx, _ = simulated(tmp_path, job)
    live = LiveContext(run_id=1, node_id=1, node_config=ctx.node_config, state=RecordDict(), run_config=ctx.run_config)
    live.live_party = introduce(live, job)
    tokens = np.arange(0, 40, 2)
    block = GradBlock(tokens, np.random.default_rng(0).normal(size=(20, 100)).astype(np.float32))

    def broken(*a, **k):
        raise OSError("disk full")

    honest = SecondaryParty.embed_tensor  # what a step embeds with (strategies/vfl/secondary.py step)
    monkeypatch.setattr(SecondaryParty, "embed_tensor", broken)
    content = messages.step_content(messages.StepRequest.build([block], tokens, live.live_party.job_id, 0))
    err = refused(lambda: client_app.step(Message(content, dst_node_id=1, message_type="train.step"), live))
    assert isinstance(err, OSError) and live.live_party is None
    monkeypatch.setattr(SecondaryParty, "embed_tensor", honest)
    again = refused(lambda: client_app.step(Message(content, dst_node_id=1, message_type="train.step"), live))
    assert again is not None and "has not been introduced" in str(again)  # not applied a second time


def test_a_step_naming_a_huge_n_apply_is_refused_before_anything_is_built():
    """n_apply = 10**9 with one array: refused by a count, not by a set of 2e9 names (a secondary's memory)."""
    import time as _time

    content = messages.step_content(messages.StepRequest.build([], np.arange(3), "j", 0))
    content.config_records["meta"]["n_apply"] = 10**9
    t0 = _time.perf_counter()
    with pytest.raises(messages.ProtocolError, match=r"n_apply = 1000000000 but the step holds 1 arrays"):
        messages.read_step(content)
    assert _time.perf_counter() - t0 < 5.0  # a count, not 2e9 names: microseconds; 5 s leaves a loaded machine room


def test_over_a_direct_link_the_packed_step_is_refused_alike(tmp_path, job):
    """The party worker's step (packed without Flower's records: strategies/wire_bytes.py) refuses
    a non-finite gradient naming the party and a body that is not a step naming the message, no
    weight changed; the good step is applied and answered."""
    from app.vfl.client import DIRECT
    from strategies.wire_bytes import pack, unpack

    ctx, _ = simulated(tmp_path, job)
    party = introduce(ctx, job)
    before = weights(ctx)
    tokens = np.arange(0, 40, 2)
    grad = np.random.default_rng(0).normal(size=(20, 100)).astype(np.float32)
    bad = grad.copy()
    bad[3, 5] = np.nan
    step = DIRECT["train.step"]
    err = refused(
        lambda: step(pack(messages.StepRequest.build([GradBlock(tokens, bad)], tokens, party.job_id, 0).encode()), ctx)
    )
    assert isinstance(err, messages.NonFiniteValues) and names(err, "party 'school'", "train.step", "gradient block 0")
    err = refused(lambda: step(b"\x00\x00\x00\x02{}", ctx))
    assert isinstance(err, messages.ProtocolError) and "train.step" in str(err), err
    assert all(torch.equal(before[k], v) for k, v in weights(ctx).items())
    good = messages.StepRequest.build([GradBlock(tokens, grad)], tokens, party.job_id, 0)
    reply = messages.StepReply.decode(*unpack(step(pack(good.encode()), ctx), "reply"), "school", "train.step")
    assert reply.emb.shape == (len(tokens), 100) and reply.applied == 1
    assert any(not torch.equal(before[k], v) for k, v in weights(ctx).items())
