"""A secondary party on its node: the protocol's secondary (strategies/vfl/secondary.py) built
from the run config and the node's own folders, its checkpoints and kept model, and its state in
``context.state`` between Flower messages."""

from __future__ import annotations

import functools
import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context

from app.config import RunConfig
from app.kept import KeptError, drop_other_attempts, party_kept_file, party_model_file
from app.party_state import load_optimizer_state, optimizer_state_records
from app.vfl.checkpoint import save_state
from app.vfl.kept import features_digest
from app.vfl.parties import build_secondary_model, secondary_features
from files.atomic import write_atomic
from files.private import private_dir
from linkage.store import load_secondary
from strategies.optim import make_optimizer
from strategies.vfl import secondary as core
from strategies.vfl.defences import ClipNoise
from strategies.vfl.secondary import LinkedRows, Local, MisalignedStep, with_imputed_row

__all__ = ["MisalignedStep", "SecondaryParty", "with_imputed_row"]


@functools.lru_cache(maxsize=8)
def _row_map(job_dir: str, party: str) -> tuple[str, np.ndarray]:
    s = load_secondary(Path(job_dir), party)
    return s.job_id, s.row_of_token


class SecondaryParty(core.SecondaryParty):
    def __init__(self, cfg: RunConfig, party: str, job_dir: str, cache_dir: str = "") -> None:
        settings = cfg.resolve()
        device, dtype = cfg.torch_device(), cfg.torch_dtype()
        job_id, row_of_token = _row_map(job_dir, party)
        features = with_imputed_row(np.array(secondary_features(cfg, party, cache_dir)), row_of_token, party)
        model = build_secondary_model(features.shape[1], party, cfg, settings).to(device, dtype)
        local = Local(
            torch.as_tensor(features, device=device, dtype=dtype),  # (n, d_S)
            model,
            make_optimizer(model.parameters(), settings.lr, settings.weight_decay),
            settings.lr,
            settings.model.cut_dim,
        )
        shield = ClipNoise(cfg.exchange.embedding_clip, cfg.exchange.embedding_noise)
        super().__init__(party, LinkedRows(job_id, row_of_token), local, shield, cfg.exchange_level())
        self.job_dir, self.cache_dir = job_dir, cache_dir

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, folder: Path, epoch: int) -> str:
        """Model, optimiser and cursor as ``epoch-<e>.pt`` (atomic); returns its SHA-256, which the
        primary records in its manifest. Files of other epochs than e and e - 1 are removed."""
        return save_state(
            folder,
            "epoch",
            epoch,
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "applied": self.applied,
                "job_id": self.job_id,
                "epoch": epoch,
                "shield": self.shield_state(),
            },
        )

    def load_checkpoint(self, folder: Path, epoch: int) -> str:
        path = Path(folder) / f"epoch-{epoch}.pt"
        if not path.exists():
            raise FileNotFoundError(f"party {self.party!r}: no checkpoint for epoch {epoch} at {path}")
        data = path.read_bytes()
        state = torch.load(io.BytesIO(data), map_location=self.device, weights_only=True)
        if state["job_id"] != self.job_id:
            raise MisalignedStep(
                f"party {self.party!r}: checkpoint {path} is for linkage job {state['job_id']!r}, "
                f"this party holds {self.job_id!r}"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.applied = int(state["applied"])
        self.load_shield_state(state.get("shield", {}))
        return hashlib.sha256(data).hexdigest()

    # ------------------------------------------------------------------ the kept federation

    def keep(self, folder: Path, epoch: int, cfg: RunConfig, attempts: dict[str, str]) -> None:
        """The state the evaluation just used, as this party's kept model for the run's training
        attempt (<folder>/kept-<attempt>.pt, app/kept.py party_kept_file: a failed rerun's keeps
        leave the finished run's; ``attempts``: {"attempt", "previous"}, the kept states that stay,
        every other dropped): weights, epoch, linkage job, the run config it was built from and a
        digest of its features, so predict rebuilds it alike and refuses changed data."""
        buf = io.BytesIO()
        torch.save(
            {
                "model": self.model.state_dict(),
                "epoch": epoch,
                "job_id": self.job_id,
                "run": json.dumps(cfg.flat()),
                "features_sha256": self.features_digest(),
                "shield": self.shield_state(),  # its secret noise and clip: predict sends what evaluation sent
            },
            buf,
        )
        write_atomic(Path(folder) / party_kept_file(attempts["attempt"]), buf.getvalue())
        drop_other_attempts(Path(folder), attempts)  # bounded, whatever names the primary sends

    def features_digest(self) -> str:
        return features_digest(self.x.cpu().numpy())

    @classmethod
    def from_kept(
        cls, path: Path, party: str, job_dir: str, paths: Callable[[RunConfig], RunConfig], cache_dir: str = ""
    ) -> "SecondaryParty":
        """This party as kept (``path``: its kept state of the run's attempt) for a run, built from
        the run config it trained with (``paths`` puts back the node's own folders); refused by name
        when nothing is kept, the job is another or the party's data changed since training."""
        if not path.exists():
            raise KeptError(
                f"party {party!r} keeps no model for this run at {path}: the run did not finish "
                "through Flower here, or this node's model folder is another"
            )
        kept = torch.load(path, map_location="cpu", weights_only=True)
        self = cls(paths(RunConfig.of(**json.loads(kept["run"]))), party, job_dir, cache_dir)
        if self.job_id != kept["job_id"]:
            raise KeptError(
                f"party {party!r}: the run was trained on linkage job {kept['job_id']!r}, but this "
                f"party's linkage folder {job_dir} holds job {self.job_id!r}"
            )
        if self.features_digest() != kept["features_sha256"]:
            raise KeptError(
                f"party {party!r}: its data changed since training (features digest differs); "
                "predict with the data the federation was trained on, or train again"
            )
        self.model.load_state_dict(kept["model"])
        self.load_shield_state(kept.get("shield", {}))
        return self

    def save(self, folder: Path, attempt: str) -> Path:
        """The final state, under the training attempt's name (:func:`app.kept.party_model_file`)."""
        private_dir(folder)
        path = folder / party_model_file(attempt)
        torch.save(self.model.state_dict(), path)
        return path

    # ------------------------------------------------------------------ context.state

    @classmethod
    def restore(cls, cfg: RunConfig, context: Context) -> "SecondaryParty":
        """The party as the last message left it: a direct transport's worker holds it in memory
        (app/party_worker.py:LiveContext); a ClientApp process rebuilds it from ``context.state``."""
        live = getattr(context, "live_party", None)
        if live is not None:
            return live
        meta = context.state.config_records.get("party")
        if meta is None:
            raise RuntimeError("this node has not been introduced: the primary must send query.hello first")
        party = cls(cfg, str(meta["party"]), str(meta["job_dir"]), str(meta.get("cache_dir", "")))
        party.applied = int(meta.get("applied", 0))
        party.load_shield_state(dict(context.state.config_records.get("shield", {})))
        if "model" in context.state.array_records:
            party.model.load_state_dict(context.state.array_records["model"].to_torch_state_dict())
            load_optimizer_state(
                party.optimizer,
                context.state.array_records["optim_arrays"],
                context.state.config_records["optim_scalars"],
            )
        return party

    def persist(self, context: Context) -> None:
        if hasattr(context, "live_party"):  # the worker outlives the message: nothing to copy
            context.live_party = self
            return
        context.state.config_records["party"] = ConfigRecord(
            {"party": self.party, "job_dir": self.job_dir, "cache_dir": self.cache_dir, "applied": self.applied}
        )
        if self.row_shield is not None:
            context.state.config_records["shield"] = ConfigRecord(self.shield_state())
        context.state.array_records["model"] = ArrayRecord({k: v.cpu() for k, v in self.model.state_dict().items()})
        arrays, scalars = optimizer_state_records(self.optimizer)
        context.state.array_records["optim_arrays"] = arrays  # keys are unique across record types
        context.state.config_records["optim_scalars"] = scalars
