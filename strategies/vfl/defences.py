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

A privacy level turns the gradient defence on without a calibration run (:func:`level_defence`:
a clip calibrated in the run and the level's noise, strategies/shields.py); a secondary's
embeddings get the level's :class:`~strategies.shields.RowShield`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from strategies.shields import GRAD_NOISE, AutoClip, clip_records, gaussian, secret_generator
from strategies.vfl.label_dp import randomised_response, rr_on_bins


@dataclass(frozen=True)
class ClipNoise:
    """An L2 bound and a noise multiplier: clip = 0 is off; noise is the std in units of clip."""

    clip: float = 0.0
    noise: float = 0.0

    @property
    def on(self) -> bool:
        return self.clip > 0


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
        per, clip = clip_records(per, defence.clip_for)
    if defence.marvell > 0:
        from strategies.vfl.marvell import marvell_noise  # lazy: scipy's optimiser, for this defence only

        per = per + marvell_noise(per.flatten(1), labels, defence.marvell, gen).view_as(per)
    block = torch.zeros(n, c, device=per.device, dtype=per.dtype).index_add_(0, index.reshape(-1), per.reshape(-1, c))
    if defence.noise > 0:
        block = block + gaussian(block.shape, 1.0, block, gen) * (defence.noise * clip)
    return block / b


class SentGradients:
    """The primary's defence of the gradient blocks it sends, per secondary: one noise stream from
    its secret (purpose "grad-noise") and, for a clip calibrated in the run, each secondary's own
    :class:`AutoClip`. The primary's strategy and the one-process twin each hold one built alike,
    so they draw alike; :meth:`state` is what a checkpoint keeps of it."""

    def __init__(self, defence: GradientDefence, parties, device: torch.device) -> None:
        self.defence, self.device = defence, device
        noisy = defence.noise > 0 or defence.marvell > 0
        self.noise = secret_generator(device, "grad-noise") if noisy else None
        self.clips = {p: AutoClip() for p in parties} if defence.auto is not None else {}

    def block(self, p: str, pair_grad: torch.Tensor, index: torch.Tensor, n: int, labels=None) -> torch.Tensor:
        """Party p's defended block (n, c) (:func:`defended_block`) with p's own calibrated clip."""
        defence = replace(self.defence, auto=self.clips[p]) if p in self.clips else self.defence
        return defended_block(pair_grad, index, n, defence, self.noise, labels)

    def clip_values(self) -> dict[str, float]:
        """Per secondary the clip calibrated in the run so far (empty with a fixed clip or none)."""
        return {p: c.value for p, c in self.clips.items()}

    def state(self) -> dict:
        """The noise generator's state and each calibrated clip: a resumed run draws as it would have."""
        clips = {p: c.last.cpu() for p, c in self.clips.items() if c.last is not None}
        return {"noise": self.noise.get_state() if self.noise is not None else None, "clips": clips}

    def load_state(self, state: dict, dtype: torch.dtype) -> None:
        if self.noise is not None and state.get("noise") is not None:
            self.noise.set_state(state["noise"])
        for p, value in state.get("clips", {}).items():
            if p in self.clips:
                self.clips[p].last = value.to(self.device, dtype)


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
    accountant = _rdp_accountant()
    rdp = accountant.compute_rdp(q=min(sample_rate, 1.0), noise_multiplier=noise, steps=steps, orders=ORDERS)
    return float(accountant.get_privacy_spent(orders=ORDERS, rdp=rdp, delta=delta)[0])


def _rdp_accountant():
    """opacus' RDP accountant, opacus/accountants/analysis/rdp.py (numpy and scipy only), loaded
    from its file: imported through its package, opacus/__init__.py imports opacus' optimisers,
    torch.distributed and sympy (~1.4 s of CPU in every primary) and calls logging.basicConfig."""
    import importlib.util  # lazy: the accountant's loader, at a run's end only
    import sys

    name = "fedsim_opacus_rdp"
    if name not in sys.modules:
        package = importlib.util.find_spec("opacus")  # found, not imported
        path = Path(package.submodule_search_locations[0]) / "accountants" / "analysis" / "rdp.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]
