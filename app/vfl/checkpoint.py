"""Checkpoints after every epoch, consistent across parties, and resuming from the last one.

After epoch e is evaluated every party has applied all of its gradient blocks, so the state
is consistent. Then:

1. in the evaluation's first exchange (no extra round trip), each secondary applies its last
   gradient blocks, saves ``epoch-<e>.pt`` (model, optimiser, cursor) on its own disk and
   answers the file's SHA-256 with its embeddings (app/client_app.py ``train.step``);
2. the primary saves ``primary-<e>.pt`` (model, optimiser, dropout generators, the epoch
   records and step losses);
3. the primary writes ``checkpoint.json`` (the commit point): epoch, seed, linkage job id,
   parties, each party's cursor and digest.

A crash before step 3 leaves the previous manifest in force (two epochs of files are kept).
Resuming loads the manifest's epoch everywhere, and refuses a party whose checkpoint digest,
cursor or linkage job differs from what the manifest recorded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from app.config import dataset_defaults
from app.config_groups import ADDED, RENAMED, RETIRED, DataOptions
from app.config_groups import MAY_CHANGE_ON_RESUME as MAY_CHANGE
from app.dataset_defaults import hand_chosen
from files.atomic import write_atomic
from files.private import private_dir
from strategies.records import EpochRecord, record_row
from strategies.vfl.gates import SeededDropout
from strategies.vfl.primary import PrimaryParty

MANIFEST = "checkpoint.json"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, or does not match this run or a party's state."""


@dataclass
class Manifest:
    epoch: int  # the last finished epoch
    seed: int
    job_id: str
    parties: dict[str, dict]  # party -> {"digest": sha256 of its file, "applied": its cursor}
    primary_digest: str
    config: dict  # the run config values that must not change on resume


def _dropouts(strategy: PrimaryParty) -> list[SeededDropout]:
    return [m for m in strategy.model.modules() if isinstance(m, SeededDropout)]


def save_state(folder: Path, prefix: str, epoch: int, state: dict) -> str:
    """``state`` as ``<prefix>-<epoch>.pt`` (atomic), older epochs pruned; returns its SHA-256,
    which the manifest records. Used by the primary and by every secondary."""
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    write_atomic(Path(folder) / f"{prefix}-{epoch}.pt", data)
    prune(folder, prefix, epoch)
    return hashlib.sha256(data).hexdigest()


def save_primary(
    folder: Path, strategy: PrimaryParty, epoch: int, records: list[EpochRecord], step_losses: list[float]
) -> str:
    return save_state(
        folder,
        "primary",
        epoch,
        {
            "model": strategy.model.state_dict(),
            "optimizer": strategy.optimizer.state_dict(),
            "dropout": [d.generator.get_state() for d in _dropouts(strategy) if d.generator is not None],
            "defence": strategy.sent.state(),
            "records": [record_row(r) for r in records],
            "step_losses": list(step_losses),
        },
    )


def prune(folder: Path, prefix: str, epoch: int) -> None:
    """Keep ``<prefix>-<e>.pt`` for this epoch and the one before (the manifest may still name
    it); remove the rest, later epochs of an earlier run included."""
    for f in Path(folder).glob(f"{prefix}-*.pt"):
        if int(f.stem.split("-")[1]) not in (epoch, epoch - 1):
            f.unlink(missing_ok=True)


def load_primary(folder: Path, strategy: PrimaryParty, manifest: Manifest) -> tuple[list[EpochRecord], list[float]]:
    path = folder / f"primary-{manifest.epoch}.pt"
    if not path.exists():
        raise CheckpointError(f"the manifest names epoch {manifest.epoch} but {path} is missing")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest.primary_digest:
        raise CheckpointError(f"{path} does not match the digest its manifest recorded")
    state = torch.load(
        io.BytesIO(data), map_location="cpu", weights_only=True
    )  # generator states must stay CPU tensors
    strategy.model.load_state_dict(state["model"])
    strategy.optimizer.load_state_dict(state["optimizer"])
    for d, g in zip([d for d in _dropouts(strategy) if d.generator is not None], state["dropout"]):
        d.generator.set_state(g)
    strategy.sent.load_state(state.get("defence", {}), strategy.dtype)
    return [EpochRecord(**r) for r in state["records"]], list(state["step_losses"])


def write_manifest(folder: Path, manifest: Manifest) -> None:
    write_atomic(folder / MANIFEST, json.dumps(dataclasses.asdict(manifest), indent=2).encode())


def read_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST
    if not path.exists():
        raise CheckpointError(f"nothing to resume: no {MANIFEST} in {folder}")
    manifest = Manifest(**json.loads(path.read_text()))
    # a checkpoint of an earlier version names a few keys as they were then, and lacks the later ones
    config = {**ADDED, **{RENAMED.get(k, k): v for k, v in manifest.config.items() if k not in RETIRED}}
    return dataclasses.replace(manifest, config=resolved(config))


def check_resume(manifest: Manifest, config: dict, job_id: str) -> None:
    """The resumed run must be the same run: same settings that shape training, same linkage."""
    changed = {k: (manifest.config.get(k), v) for k, v in config.items() if manifest.config.get(k) != v}
    if changed:
        raise CheckpointError(
            f"cannot resume: the run config differs from the checkpoint's in {changed} "
            "(checkpoint value, this run's value)"
        )
    if manifest.job_id != job_id:
        raise CheckpointError(
            f"cannot resume: the checkpoint trained on linkage job {manifest.job_id!r}, this run has {job_id!r}"
        )


def check_parties(manifest: Manifest, states: dict[str, dict]) -> None:
    """Every party restored exactly the state the manifest recorded."""
    if sorted(states) != sorted(manifest.parties):
        raise CheckpointError(f"the checkpoint holds parties {sorted(manifest.parties)}, this run has {sorted(states)}")
    for party, want in manifest.parties.items():
        got = states[party]
        if got["digest"] != want["digest"] or got["applied"] != want["applied"]:
            raise CheckpointError(
                f"party {party!r} restored a checkpoint other than the one recorded at epoch "
                f"{manifest.epoch} (digest {got['digest'][:12]} vs {want['digest'][:12]}, cursor "
                f"{got['applied']} vs {want['applied']})"
            )


def resolved(config: dict) -> dict:
    """``config`` (flat) with each key whose "" means the dataset's choice set to that choice, so
    a checkpoint and a run compare what they train with, not how they said it."""
    config = hand_chosen(config)  # an hparams "dataset" run's unset recipe keys: the hand-chosen values
    dataset = str(config.get("dataset", ""))
    data = DataOptions(dataset=dataset)  # its scale and missing_values: the dataset's choices
    model = dataset_defaults(dataset).model
    chosen = {
        "input_scale": data.scale,
        "missing": data.missing_values,
        "attention_start": model.attention_start,
        "attention_lr": model.attention_lr,
    }
    return {k: chosen[k] if k in chosen and v in ("", 0.0) else v for k, v in config.items()}


def fixed_config(cfg) -> dict:
    return resolved({k: v for k, v in cfg.flat().items() if k not in MAY_CHANGE})


def fresh(folder: Path) -> None:
    """A run that does not resume starts without the checkpoint of an earlier run of that name
    (its manifest would otherwise stay in force until this run's first epoch)."""
    (folder / MANIFEST).unlink(missing_ok=True)
    for f in folder.glob("primary-*.pt"):
        f.unlink()


def checkpointer(folder: Path, strategy: PrimaryParty, channel, cfg, job_id: str):
    """The ``after_epoch`` hook of :func:`strategies.vfl.protocol.fit` that checkpoints every party."""
    private_dir(folder)

    def after_epoch(epoch: int, records: list[EpochRecord], step_losses: list[float]) -> None:
        # the parties saved theirs in the evaluation's first exchange (fit's checkpoint_dir)
        saved = channel.saved if channel else {}
        states = {p: {"digest": s["digest"], "applied": s["applied"]} for p, s in saved.items()}
        for party, s in saved.items():
            if s["epoch"] != epoch:
                raise CheckpointError(f"party {party!r} last checkpointed epoch {s['epoch']}, not {epoch}")
            if s["applied"] != channel.cursor[party]:
                raise CheckpointError(
                    f"party {party!r} checkpointed at cursor {s['applied']}, the primary is at {channel.cursor[party]}"
                )
        digest = save_primary(folder, strategy, epoch, records, step_losses)
        write_manifest(folder, Manifest(epoch, cfg.train.seed, job_id, states, digest, fixed_config(cfg)))

    return after_epoch


def resume(folder: Path, strategy: PrimaryParty, channel, cfg, job_id: str) -> tuple[list[EpochRecord], list[float]]:
    """Load the last committed checkpoint into the primary and every party; returns the finished
    epochs' records and step losses for :func:`strategies.vfl.protocol.fit`."""
    manifest = read_manifest(folder)
    check_resume(manifest, fixed_config(cfg), job_id)
    done = load_primary(folder, strategy, manifest)
    if channel is not None:
        check_parties(manifest, channel.restore(str(folder), manifest.epoch))
    return done
