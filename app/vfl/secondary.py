"""A secondary party: its local model and optimiser, kept in ``context.state`` between
messages, answering embedding requests and applying gradient blocks in order."""

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
from app.kept import KeptError
from app.messages import StepMeta, require_finite, require_lr_scale, step_digest
from app.party_state import load_optimizer_state, optimizer_state_records
from app.vfl.checkpoint import save_state
from app.vfl.kept import PARTY_KEPT, features_digest
from app.vfl.parties import build_secondary_model, secondary_features
from files.atomic import write_atomic
from files.private import private_dir
from linkage.store import load_secondary
from strategies.optim import make_optimizer, set_lr
from strategies.shields import RowShield, level_shield, reloaded, secret_generator, split_shield, with_shield
from strategies.vfl.defences import ClipNoise, clipped_rows
from strategies.vfl.exchange_checks import Expect, PeerValueError, check_block
from strategies.vfl.fedsim import GradBlock


@functools.lru_cache(maxsize=8)
def _row_map(job_dir: str, party: str) -> tuple[str, np.ndarray]:
    s = load_secondary(Path(job_dir), party)
    return s.job_id, s.row_of_token


class MisalignedStep(RuntimeError):
    """A step message that does not fit this party's linkage job or training position."""


def with_imputed_row(features: np.ndarray, row_of_token: np.ndarray, party: str) -> np.ndarray:
    """The party's rows. A linkage that maps tokens to row n of an n-row party (Exact: records
    without an exact match) gets that extra row as the party's mean features. A chain's map has
    the anchor's length and may point at any of the party's rows."""
    top = int(row_of_token.max()) if len(row_of_token) else -1
    if top == len(features):
        return np.vstack([features, features.mean(0, keepdims=True)])
    if top > len(features):
        raise ValueError(
            f"party {party!r}: linkage job maps tokens to row {top} but the party has {len(features)} rows"
        )
    return features


class SecondaryParty:
    def __init__(self, cfg: RunConfig, party: str, job_dir: str, cache_dir: str = "") -> None:
        settings = cfg.resolve()
        self.party, self.job_dir, self.cache_dir = party, job_dir, cache_dir
        self.device, self.dtype = cfg.torch_device(), cfg.torch_dtype()
        self.job_id, self.row_of_token = _row_map(job_dir, party)
        self.applied = 0  # gradient blocks applied so far (the step cursor)
        features = with_imputed_row(np.array(secondary_features(cfg, party, cache_dir)), self.row_of_token, party)
        self.x = torch.as_tensor(features, device=self.device, dtype=self.dtype)  # (n, d_S)
        self.model = build_secondary_model(features.shape[1], party, cfg, settings).to(self.device, self.dtype)
        self.cut_dim = settings.model.cut_dim  # c: the width of its embeddings and of their gradients
        self.lr = settings.lr  # its own; a step's lr_scale (the primary's schedule) only lowers it
        self.optimizer = make_optimizer(self.model.parameters(), settings.lr, settings.weight_decay)
        # the embeddings it sends clipped and noised (strategies/vfl/defences.py), from its own secret:
        # as its explicit embedding-clip / -noise say, else as its privacy level says (a RowShield)
        self.shield = ClipNoise(cfg.exchange.embedding_clip, cfg.exchange.embedding_noise)
        self.noise = secret_generator(self.device, f"embedding-noise/{party}") if self.shield.noise > 0 else None
        self.row_shield = self._level_shield(cfg.exchange_level(), len(features))

    def _level_shield(self, level: str, n_rows: int) -> RowShield | None:
        like = torch.empty(0, self.cut_dim, device=self.device, dtype=self.dtype)  # (0, c)
        return level_shield(level, self.shield.on, n_rows, like, self.party)

    def shield_state(self) -> dict:
        return self.row_shield.state() if self.row_shield is not None else {}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What an in-process run keeps of this party (app/kept.py Keeper): its model's state and
        its shield's, so predict sends what the evaluation sent."""
        return with_shield(self.model.state_dict(), self.row_shield)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """:meth:`state_dict`'s inverse (a state without a shield: the model's alone)."""
        model, shield = split_shield(state)
        self.model.load_state_dict(model)
        self.load_shield_state(shield)

    def load_shield_state(self, state: dict) -> None:
        self.row_shield = reloaded(self.row_shield, state)

    # ------------------------------------------------------------------ protocol steps

    def rows(self, tokens: np.ndarray) -> torch.Tensor:
        if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            found = f"{tokens.dtype} {tokens.shape}" if isinstance(tokens, np.ndarray) else type(tokens).__name__
            raise PeerValueError(
                f"party {self.party!r}: tokens from the primary must be one vector of integers, got {found}"
            )
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= len(self.row_of_token)):
            raise PeerValueError(f"party {self.party!r}: token out of range [0, {len(self.row_of_token)})")
        return torch.as_tensor(self.row_of_token[tokens], device=self.device)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """(U,) tokens -> (U, c) embeddings from the current weights, a host array (a message's)."""
        return self.embed_tensor(tokens).cpu().numpy()

    @torch.no_grad()
    def embed_tensor(self, tokens: np.ndarray) -> torch.Tensor:
        """:meth:`embed` on this party's device (an in-process channel's: no host round trip)."""
        return self.embed_rows(self.rows(tokens))

    @torch.no_grad()
    def embed_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """(R,) rows of this party -> (R, c) embeddings as it sends them: clipped and noised where
        the run's embedding defence says."""
        if self.row_shield is not None:
            return self.row_shield.ready(self._every).send(self.model(self.x[rows]), rows)
        return clipped_rows(self.model(self.x[rows]), self.shield, self.noise)

    def apply(self, blocks: list[GradBlock], lr_scale: float = 1.0) -> None:
        """Backpropagate each block's gradient through a fresh forward pass, one step each, at
        ``lr_scale`` (0, 1] of this party's learning rate (the primary's schedule).
        Every block is checked first (finite in this party's dtype, tokens in range, one (U, c)
        row per token): a refused message changes no weight. The blocks' gradients may be host
        arrays (a message's) or tensors (an in-process primary's); all blocks' finiteness is read
        back in one host sync, not one per block."""
        require_lr_scale(lr_scale, f"party {self.party!r}")
        for j, block in enumerate(blocks):  # a message's arrays: exactly (U, c) in this party's dtype, bounded
            self.rows(block.tokens)
            shape = (len(block.tokens), self.cut_dim)
            check_block(
                block.grad,
                Expect("the primary", f"gradient block {j}", "train.step", shape, self.dtype, self.party),
            )
        grads = [torch.as_tensor(b.grad, device=self.device, dtype=self.dtype) for b in blocks]  # each (U, c)
        finite = torch.stack([g.isfinite().all() for g in grads]).tolist() if grads else []
        for j, (block, grad) in enumerate(zip(blocks, grads)):
            if not finite[j]:
                require_finite(grad, self.party, f"gradient block {j} (as {self.dtype})", "train.step")
            want = (len(block.tokens), self.cut_dim)
            if tuple(grad.shape) != want:
                raise ValueError(
                    f"party {self.party!r}: gradient block {j} in train.step has shape "
                    f"{tuple(grad.shape)}, expected {want} (one row per token, cut size {self.cut_dim})"
                )
        set_lr(self.optimizer, self.lr * lr_scale)
        for block, grad in zip(blocks, grads):
            out = self.model(self.x[self.rows(block.tokens)])  # (U, c)
            out = clipped_rows(out, ClipNoise(self.shield.clip), None)  # the clip's own gradient (noise: a constant)
            if self.row_shield is not None:
                out = self.row_shield.ready(self._every).clipped(out)
            self.optimizer.zero_grad(set_to_none=True)
            out.backward(grad)
            self.optimizer.step()
            self.applied += 1
            if self.row_shield is not None:
                self.row_shield.stepped(self.applied, self._every)

    def _every(self) -> torch.Tensor:
        """(n, c) this party's embeddings of all its records (its shield's calibration)."""
        return self.model(self.x)

    def check(self, meta: StepMeta, blocks: list[GradBlock], tokens: np.ndarray) -> None:
        """Refuse a step that belongs to another linkage job, another training position, or
        whose token lists are not the ones the primary hashed: never train on wrong rows."""
        if meta.job_id != self.job_id:
            raise MisalignedStep(
                f"party {self.party!r}: step for linkage job {meta.job_id!r}, but this party "
                f"holds job {self.job_id!r}; refusing to train on misaligned rows"
            )
        if meta.cursor != self.applied:
            raise MisalignedStep(
                f"party {self.party!r}: the primary is at step {meta.cursor} but this party has "
                f"applied {self.applied} gradient blocks (a lost message or a restore from another "
                "checkpoint); refusing to continue"
            )
        if step_digest(meta.job_id, meta.cursor, blocks, tokens, meta.lr_scale) != meta.digest:
            raise MisalignedStep(
                f"party {self.party!r}: the step's token lists do not match their digest "
                f"(cursor {meta.cursor}); refusing to train on misaligned rows"
            )

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

    def keep(self, folder: Path, epoch: int, cfg: RunConfig) -> None:
        """The state the evaluation just used, as this party's kept model for the run
        (<folder>/kept.pt): weights, epoch, linkage job, the run config it was built from and a
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
        write_atomic(Path(folder) / PARTY_KEPT, buf.getvalue())

    def features_digest(self) -> str:
        return features_digest(self.x.cpu().numpy())

    @classmethod
    def from_kept(
        cls, folder: Path, party: str, job_dir: str, paths: Callable[[RunConfig], RunConfig], cache_dir: str = ""
    ) -> "SecondaryParty":
        """This party as kept for a run, built from the run config it trained with (``paths``
        puts back the node's own folders); refused by name when nothing is kept, the job is
        another or the party's data changed since training."""
        path = Path(folder) / PARTY_KEPT
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

    def save(self, folder: Path) -> Path:
        private_dir(folder)
        torch.save(self.model.state_dict(), folder / "model.pt")
        return folder / "model.pt"

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
