"""Defences of what split learning exchanges, each applied by the party it protects, with noise
from a secret only that party holds (``secrets``, never the run's seed: the other parties know
the run config).

- **Cut-layer gradient clipping + Gaussian noise** (the primary, protecting its labels and
  features from the secondaries): each primary record's gradient w.r.t. its K linked embeddings
  (K * c numbers, in the scale of its own loss) is clipped to L2 norm ``clip``, the clipped pairs
  are summed per secondary record, and N(0, (noise * clip)^2) is added to every entry of the
  block before the batch mean. :func:`epsilon` is what the DP-SGD accountant (Opacus' RDP,
  Poisson sampling at rate B / n assumed; we shuffle) says of the released blocks per secondary.
  It is not an end-to-end guarantee: the primary's own model is updated with the exact
  gradients, so later blocks depend on the labels through it as well (docs/privacy.md).
- **Marvell** (the primary, binary labels; strategies/vfl/marvell.py): per-record noise whose
  covariance per label is optimised each batch to make the labels' gradients alike.
- **Label DP** (the primary): the training labels are randomised once before training:
  k-ary randomised response for classes, randomised response on bins for the [0, 1]-scaled
  regression target (strategies/vfl/label_dp.py; Laplace noise before 2026-11-28). Everything
  after is post-processing: an epsilon-label-DP guarantee for the training labels against every
  other party.
- **Embedding clipping + noise** (a secondary, protecting its features from the primary): each
  embedding row it sends is clipped to L2 norm ``clip`` and gets N(0, (noise * clip)^2) per entry.

A privacy level (``privacy``: off / standard / strict, linkage/protection.py) turns the gradient
defence on without a calibration run: the clip is :class:`AutoClip` (the median per-record norm
the party clipped at its previous step) and the noise :data:`GRAD_NOISE` of the level.
``$FEDSIM_PARTY_SEED`` (a party's own environment, never the run config) makes a party's draws
reproducible for tests and twin oracles: a guessable seed lets the others undo the noise.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from dataclasses import dataclass, field

import numpy as np
import torch

from strategies.vfl.label_dp import randomised_response, rr_on_bins


@dataclass(frozen=True)
class ClipNoise:
    """An L2 bound and a noise multiplier: clip = 0 is off; noise is the std in units of clip."""

    clip: float = 0.0
    noise: float = 0.0

    @property
    def on(self) -> bool:
        return self.clip > 0


GRAD_NOISE = {"off": 0.0, "standard": 4.0, "strict": 8.0}  # a level's gradient noise, in units of the clip
EMBED_NOISE = {"off": 0.0, "standard": 1.0, "strict": 2.0}  # a level's embedding noise: its norm per row / the clip
PARTY_SEED_ENV = "FEDSIM_PARTY_SEED"


def party_secret(purpose: str) -> int:
    """A 63-bit secret of this party for ``purpose``: from the OS's CSPRNG, or, where the
    party's own environment sets ``$FEDSIM_PARTY_SEED``, from that seed and ``purpose`` (two
    purposes never share a stream)."""
    raw = os.environ.get(PARTY_SEED_ENV, "").strip()
    if not raw:
        return secrets.randbits(63)
    return int.from_bytes(hashlib.sha256(f"{raw}/{purpose}".encode()).digest()[:8], "little") >> 1


def secret_generator(device: torch.device, purpose: str = "") -> torch.Generator:
    """A torch generator on ``device`` seeded with :func:`party_secret` of ``purpose``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(party_secret(purpose))
    return gen


@dataclass
class AutoClip:
    """A clip calibrated within the run, without an undefended run first: the median L2 norm of
    the rows the party clipped at its previous step (at its first step, its own). The clip
    depends on earlier steps' data, so an accountant's epsilon over it is approximate
    (docs/privacy.md). ``last`` stays on the device: no host sync per step."""

    last: torch.Tensor | None = None

    def take(self, norms: torch.Tensor) -> torch.Tensor:
        """The clip for rows of ``norms`` (R,): the previous step's median; this step's is kept."""
        median = norms.detach().median()
        clip = median if self.last is None else self.last
        self.last = median
        return clip

    @property
    def value(self) -> float:
        """The clip the next step will use (0 before any step)."""
        return float(self.last) if self.last is not None else 0.0


class RowShield:
    """A secondary's level defence of the embeddings it sends (its features, against the
    primary's inversion): each row clipped to a clip calibrated in the run, the median norm of
    the party's embeddings of all its records (at its first send, then after every
    :data:`RECALIBRATE` training steps), plus its record's own noise, N(0, (noise * clip)^2 / c)
    per entry (a row's noise norm ~ noise x the clip). The noise is fixed per record, drawn
    once from the party's secret ``seed``: sending a record again never gives a fresh draw to
    average, and a prediction sees what the evaluation saw. :meth:`state` is what the party
    keeps to rebuild it (checkpoint, kept model, message state). The one-process twin
    (strategies/vfl/twin.py) calibrates at the same steps, so it sees the same values."""

    RECALIBRATE = 50

    def __init__(self, noise: float, n_rows: int, like: torch.Tensor, seed: int) -> None:
        self.noise, self.seed, self.n_rows, self.like = noise, seed, n_rows, like  # like: (0, c) device, dtype
        self._mask: torch.Tensor | None = None  # (n, c) drawn at the first send (a message's state rebuilds it)
        self.clip: torch.Tensor | None = None  # None until :meth:`calibrate`

    @property
    def mask(self) -> torch.Tensor:
        """(n, c) each record's noise direction, N(0, 1 / c) per entry, from the party's secret."""
        if self._mask is None:
            width, like = self.like.shape[1], self.like
            gen = torch.Generator(device=like.device).manual_seed(self.seed)
            self._mask = torch.randn(self.n_rows, width, generator=gen, device=like.device, dtype=like.dtype)
            self._mask /= width**0.5
        return self._mask

    def calibrate(self, every: torch.Tensor) -> None:
        """The clip from (n, c) embeddings of all the party's records: their median norm."""
        self.clip = every.detach().norm(dim=1).median()

    def due(self, applied: int) -> bool:
        """Whether the clip is recalibrated after ``applied`` training steps."""
        return applied % self.RECALIBRATE == 0

    def send(self, out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """(R, c) embeddings of rows ``rows`` (R,) as sent: clipped and given their noise."""
        return self.clipped(out) + self.mask[rows] * (self.noise * self.clip)

    def clipped(self, out: torch.Tensor) -> torch.Tensor:
        """(R, c) rows clipped to the clip (differentiable: a backward's fresh forward)."""
        return out * (self.clip / out.norm(dim=1).clamp_min(1e-12)).clamp(max=1.0)[:, None]

    def state(self) -> dict:
        """Plain numbers (a message state's ConfigRecord, a kept file): clip -1 before calibration."""
        return {"noise": self.noise, "seed": self.seed, "clip": -1.0 if self.clip is None else float(self.clip)}

    @classmethod
    def from_state(cls, state: dict, n_rows: int, like: torch.Tensor) -> "RowShield":
        shield = cls(float(state["noise"]), n_rows, like, int(state["seed"]))
        clip = float(state["clip"])
        shield.clip = None if clip < 0 else torch.tensor(clip, device=like.device, dtype=like.dtype)
        return shield


def gaussian(shape, std: float, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """N(0, std^2) of ``shape`` in ``like``'s device and dtype, drawn from ``gen``."""
    return torch.randn(shape, generator=gen, device=like.device, dtype=like.dtype) * std


@dataclass(frozen=True)
class GradientDefence:
    """The primary's defence of the cut-layer gradients it sends: per-record clipping and
    Gaussian noise (:class:`ClipNoise`'s fields), and/or Marvell's noise for binary labels
    (strategies/vfl/marvell.py; ``marvell`` its power budget in units of |Delta|^2; 0 = off)."""

    clip: float = 0.0
    noise: float = 0.0
    marvell: float = 0.0
    auto: AutoClip | None = field(default=None, compare=False)  # the clip calibrated in the run (clip 0)

    @property
    def on(self) -> bool:
        return self.clip > 0 or self.marvell > 0 or self.auto is not None

    def clip_for(self, norms: torch.Tensor) -> torch.Tensor | float:
        """The clip in force for records of ``norms`` (B,): fixed, or calibrated in the run."""
        return self.auto.take(norms) if self.auto is not None else self.clip


def level_shield(level: str, explicit: bool, n_rows: int, like: torch.Tensor, party: str) -> RowShield | None:
    """Secondary ``party``'s embedding defence at privacy ``level`` (None at "off" or where it set
    an ``explicit`` embedding clip), its noise from the party's secret; ``like`` (0, c) gives
    the embeddings' width, device and dtype."""
    noise = EMBED_NOISE[level]
    if explicit or noise == 0:
        return None
    return RowShield(noise, n_rows, like, party_secret(f"embedding-mask/{party}"))


def level_defence(level: str, marvell: float = 0.0) -> GradientDefence:
    """The gradient defence a privacy level gives when no clip is set: :class:`AutoClip` and
    the level's noise (none at "off", where only an explicit Marvell remains)."""
    noise = GRAD_NOISE[level]
    return GradientDefence(noise=noise, marvell=marvell, auto=AutoClip() if noise > 0 else None)


def defended_block(
    pair_grad: torch.Tensor, index: torch.Tensor, n: int, defence: GradientDefence, gen, labels=None
) -> torch.Tensor:
    """The defended gradient block (n, c) of a step whose loss is the batch mean: ``pair_grad``
    (B, K, c) the gradient w.r.t. each pair's embedding, ``index`` (B, K) each pair's row in the
    block, ``labels`` (B,) the batch's (Marvell). Each record's (K, c) share, times B (its own
    loss's scale), is clipped to ``clip`` and/or gets Marvell's noise; the shares are summed per
    row, Gaussian noise added, and the sum divided by B again."""
    b, _, c = pair_grad.shape
    per = pair_grad * b  # (B, K, c) each record's gradient of its own loss
    clip = 0.0
    if defence.clip > 0 or defence.auto is not None:
        norms = per.flatten(1).norm(dim=1)  # (B,)
        clip = defence.clip_for(norms)
        per = per * (clip / norms.clamp_min(1e-12)).clamp(max=1.0)[:, None, None]
    if defence.marvell > 0:
        from strategies.vfl.marvell import marvell_noise  # lazy: scipy's optimiser, for this defence only

        per = per + marvell_noise(per.flatten(1), labels, defence.marvell, gen).view_as(per)
    block = torch.zeros(n, c, device=per.device, dtype=per.dtype).index_add_(0, index.reshape(-1), per.reshape(-1, c))
    if defence.noise > 0:
        block = block + gaussian(block.shape, 1.0, block, gen) * (defence.noise * clip)
    return block / b


def clipped_rows(rows: torch.Tensor, defence: ClipNoise, gen) -> torch.Tensor:
    """Embedding rows (U, c) clipped to L2 norm ``clip`` each, with N(0, (noise * clip)^2) added;
    the rows as they are when the defence is off (clip 0)."""
    if not defence.on:
        return rows
    norms = rows.norm(dim=1, keepdim=True).clamp_min(1e-12)  # (U, 1)
    out = rows * (defence.clip / norms).clamp(max=1.0)
    if defence.noise > 0:
        out = out + gaussian(out.shape, defence.noise * defence.clip, out, gen)
    return out


def randomised_labels(
    y: np.ndarray, task: str, epsilon: float, rng: np.random.Generator, n_classes: int = 2
) -> np.ndarray:
    """epsilon-label-DP labels. Classes: each kept with probability e^eps / (e^eps + k - 1), else
    one of the k - 1 others uniformly. Regression (``y`` scaled to [0, 1]): randomised response
    on bins (strategies/vfl/label_dp.py)."""
    if task == "regression":
        return rr_on_bins(y, epsilon, rng)
    k = 2 if task == "binary" else n_classes
    return randomised_response(y.astype(int), k, epsilon, rng).astype(y.dtype)


ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128, 256, 512, 1024, 4096]


def epsilon(noise: float, sample_rate: float, steps: int, delta: float) -> float:
    """The (epsilon, delta) the RDP accountant gives ``steps`` Poisson-subsampled Gaussian
    mechanisms of noise multiplier ``noise`` at ``sample_rate``; inf without noise."""
    if noise <= 0:
        return float("inf")
    root = logging.getLogger()
    handlers = list(root.handlers)
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent  # lazy: heavy import

    root.handlers[:] = handlers  # opacus' import calls logging.basicConfig: undone

    rdp = compute_rdp(q=min(sample_rate, 1.0), noise_multiplier=noise, steps=steps, orders=ORDERS)
    return float(get_privacy_spent(orders=ORDERS, rdp=rdp, delta=delta)[0])
