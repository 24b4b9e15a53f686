"""Checkpoints, resume after a crash, and the per-step alignment check (issue 5)."""

import shutil

import numpy as np
import pytest

from app import messages
from app.config import ConfigError, RunConfig
from app.vfl import checkpoint, exchange
from app.vfl.inprocess import _local_parties, _setup
from app.vfl.parties import build_strategy
from app.vfl.secondary import MisalignedStep
from strategies.vfl.channel import LocalChannel
from strategies.vfl.protocol import Hooks, fit
from strategies.vfl.wire import GradBlock

CFG = dict(dataset="hdb", n_rows=1200, k=10, batch_size=64, epochs=3, steps_per_exchange=1)  # CNN merge + dropout


class Crash(RuntimeError):
    pass


def _run(
    cfg: RunConfig,
    folder,
    crash_after: int | None = None,
    resume: bool = False,
    crash_before_manifest: int | None = None,
):
    """The federated protocol in one process, checkpointing into ``folder``; optionally crash
    right after epoch ``crash_after``'s checkpoint, or after the parties saved epoch
    ``crash_before_manifest`` but before the primary committed it, or start from the last
    checkpoint."""
    cfg, settings, ds, linkage, job, plan = _setup(cfg, None)
    strategy = build_strategy(ds, linkage, cfg, settings)
    exchange.protect(strategy, ds, cfg, settings, "test")  # the default's gradient noise, resumed too
    channel = LocalChannel(_local_parties(cfg, ds, job, linkage))
    done = checkpoint.resume(folder, strategy, channel, cfg, linkage.job_id) if resume else None
    save = checkpoint.checkpointer(folder, strategy, channel, cfg, linkage.job_id)

    def after_epoch(epoch, records, losses):
        save(epoch, records, losses)
        if epoch == crash_after:
            raise Crash

    def on_epoch(rec):
        if rec.epoch == crash_before_manifest:  # the parties saved in the evaluation's exchange
            raise Crash

    records, losses = fit(
        strategy, channel, ds.split, plan, Hooks(on_epoch, after_epoch=after_epoch, checkpoint_dir=str(folder)), done
    )
    return records, losses, strategy, channel


def test_a_run_resumed_after_a_crash_ends_like_the_uninterrupted_run(tmp_path):
    cfg = RunConfig.of(**CFG, out_dir=str(tmp_path))
    full, full_losses, _, _ = _run(cfg, tmp_path / "full")
    with pytest.raises(Crash):
        _run(cfg, tmp_path / "ckpt", crash_after=0)
    assert checkpoint.read_manifest(tmp_path / "ckpt").epoch == 0
    resumed, losses, _, _ = _run(cfg, tmp_path / "ckpt", resume=True)
    assert [r.epoch for r in resumed] == [0, 1, 2]
    np.testing.assert_allclose(losses, full_losses, rtol=1e-4, atol=1e-6)
    for a, b in zip(resumed, full):
        for split in ("val", "test"):
            for key in a.val:
                assert getattr(a, split)[key] == pytest.approx(getattr(b, split)[key], rel=1e-4, abs=1e-5)


def test_the_resume_oracle_can_fail(tmp_path):
    """Resuming a checkpoint without its dropout generators and optimiser state gives other losses."""
    cfg = RunConfig.of(**CFG, out_dir=str(tmp_path))
    _, full_losses, _, _ = _run(cfg, tmp_path / "full")
    with pytest.raises(Crash):
        _run(cfg, tmp_path / "ckpt", crash_after=0)
    cfg2, settings, ds, linkage, job, plan = _setup(cfg, None)
    strategy = build_strategy(ds, linkage, cfg2, settings)
    channel = LocalChannel(_local_parties(cfg2, ds, job, linkage))
    manifest = checkpoint.read_manifest(tmp_path / "ckpt")
    state = __import__("torch").load(tmp_path / "ckpt" / f"primary-{manifest.epoch}.pt", weights_only=True)
    strategy.model.load_state_dict(state["model"])  # weights only: a fresh optimiser and dropout stream
    channel.restore(str(tmp_path / "ckpt"), manifest.epoch)
    _, losses = fit(strategy, channel, ds.split, plan, done=([None] * (manifest.epoch + 1), state["step_losses"]))
    assert np.abs(np.asarray(losses) - np.asarray(full_losses)).max() > 1e-3


def test_resume_refuses_another_run_or_a_tampered_party_checkpoint(tmp_path):
    cfg = RunConfig.of(**CFG, out_dir=str(tmp_path))
    with pytest.raises(Crash):
        _run(cfg, tmp_path / "ckpt", crash_after=0)
    with pytest.raises(checkpoint.CheckpointError, match=r"differs from the checkpoint's in \{'lr'"):
        _run(cfg.replace(lr=0.5), tmp_path / "ckpt", resume=True)
    kept = tmp_path / "kept"
    shutil.copytree(tmp_path / "ckpt", kept)
    party_file = kept / "school" / "epoch-0.pt"
    party_file.write_bytes(party_file.read_bytes() + b"\0")  # another state than the manifest recorded
    with pytest.raises(checkpoint.CheckpointError, match="party 'school' restored a checkpoint other than"):
        _run(cfg, kept, resume=True)
    with pytest.raises(checkpoint.CheckpointError, match="nothing to resume"):
        _run(cfg, tmp_path / "empty", resume=True)
    with pytest.raises(ConfigError, match="'resume' needs 'run-name'"):
        RunConfig.from_flower({"resume": True})


def test_a_party_refuses_a_misaligned_step(tmp_path):
    cfg = RunConfig.of(dataset="hdb", n_rows=600, k=5, out_dir=str(tmp_path))
    cfg, settings, ds, linkage, job, plan = _setup(cfg, None)
    party = _local_parties(cfg, ds, job, linkage)["school"]
    tokens = linkage.tokens["school"][:4].ravel()
    block = GradBlock(np.unique(tokens), np.zeros((len(np.unique(tokens)), settings.model.cut_dim), np.float32))

    def check(content):
        req = messages.read_step(content)
        party.check(req.meta, req.apply, req.tokens)
        party.apply(req.apply)

    check(messages.step_content(messages.StepRequest.build([], tokens, party.job_id, 0)))  # aligned: accepted
    check(messages.step_content(messages.StepRequest.build([block], tokens, party.job_id, 0)))
    assert party.applied == 1
    with pytest.raises(MisalignedStep, match="step for linkage job 'other'"):
        check(messages.step_content(messages.StepRequest.build([block], tokens, "other", 1)))
    with pytest.raises(MisalignedStep, match="the primary is at step 0 but this party has applied 1"):
        check(messages.step_content(messages.StepRequest.build([block], tokens, party.job_id, 0)))  # a replayed message
    tampered = messages.step_content(messages.StepRequest.build([block], tokens, party.job_id, 1))
    tampered.array_records["step"]["tokens"] = messages.Array(tokens[::-1].copy())
    with pytest.raises(MisalignedStep, match="do not match their digest"):
        check(tampered)
    assert party.applied == 1  # nothing refused was applied


def test_a_crash_between_the_parties_save_and_the_manifest_resumes_from_the_epoch_before(tmp_path):
    cfg = RunConfig.of(**CFG, out_dir=str(tmp_path))
    _, full_losses, _, _ = _run(cfg, tmp_path / "full")
    with pytest.raises(Crash):
        _run(cfg, tmp_path / "ckpt", crash_before_manifest=1)
    assert (tmp_path / "ckpt" / "school" / "epoch-1.pt").exists()  # saved, but not committed
    assert checkpoint.read_manifest(tmp_path / "ckpt").epoch == 0
    _, losses, _, _ = _run(cfg, tmp_path / "ckpt", resume=True)
    np.testing.assert_allclose(losses, full_losses, rtol=1e-4, atol=1e-6)


def test_a_fresh_run_under_an_old_name_never_resumes_the_old_run(tmp_path):
    cfg = RunConfig.of(**CFG, out_dir=str(tmp_path))
    with pytest.raises(Crash):
        _run(cfg, tmp_path / "ckpt", crash_after=1)  # an earlier run left epochs 0-1
    checkpoint.fresh(tmp_path / "ckpt")  # what the ServerApp does for a run that does not resume
    with pytest.raises(checkpoint.CheckpointError, match="nothing to resume"):
        _run(cfg, tmp_path / "ckpt", resume=True)


def _manifest(folder, config: dict) -> None:
    folder.mkdir()
    body = dict(epoch=0, seed=0, job_id="j", parties={}, primary_digest="d", config=config)
    (folder / checkpoint.MANIFEST).write_text(__import__("json").dumps(body))


def test_a_checkpoint_from_before_the_recipe_keys_resumes_where_nothing_changed(tmp_path):
    """Checkpoints written before input-scale, missing, lr-decay / lr-patience, attention-start and
    ple-bins existed hold none of them: each is compared as the value it had then (standard inputs,
    the mean, a constant rate, the Top1Sim start, 16 bins), and a key whose "" means the dataset's
    choice is compared resolved. So such a run resumes where today's defaults train alike, and is
    refused by name where they would not (house with its hand-chosen recipe, hparams "dataset": ple
    inputs and the silent start)."""
    new = ("input_scale", "missing", "lr_decay", "lr_patience", "attention_start", "ple_bins")
    for dataset, hparams in (("synthetic", "reference"), ("house", "dataset")):
        cfg = RunConfig.of(dataset=dataset, hparams=hparams, method="fedsim_attn", out_dir=str(tmp_path))
        old = {k: v for k, v in checkpoint.fixed_config(cfg).items() if k not in new}
        _manifest(tmp_path / dataset, old)
        manifest = checkpoint.read_manifest(tmp_path / dataset)
        if dataset == "synthetic":
            checkpoint.check_resume(manifest, checkpoint.fixed_config(cfg), "j")
        else:
            with pytest.raises(checkpoint.CheckpointError, match="input_scale.*'standard', 'ple'"):
                checkpoint.check_resume(manifest, checkpoint.fixed_config(cfg), "j")
            same = cfg.replace(input_scale="standard", attention_start="top1")
            checkpoint.check_resume(manifest, checkpoint.fixed_config(same), "j")
    hand = RunConfig.of(dataset="house", hparams="dataset", out_dir=str(tmp_path))
    _manifest(tmp_path / "today", {**checkpoint.fixed_config(hand), "input_scale": "", "attention_start": ""})
    today = checkpoint.read_manifest(tmp_path / "today")  # "" stored: the hand-chosen recipe's, resolved
    checkpoint.check_resume(today, checkpoint.fixed_config(hand), "j")
    with pytest.raises(checkpoint.CheckpointError, match="input_scale.*'ple', 'standard'"):
        checkpoint.check_resume(today, checkpoint.fixed_config(hand.replace(hparams="reference", input_scale="")), "j")
