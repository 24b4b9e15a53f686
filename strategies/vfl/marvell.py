"""Marvell (Li et al., "Label Leakage and Protection in Two-party Split Learning", ICLR 2022):
noise on each record's cut-layer gradient, its covariance chosen per batch and label to make the
two labels' gradient distributions as alike as a power budget allows.

Per batch, the positive and negative records' gradient shares (B, D) are modelled as Gaussians
with means mu_1, mu_0 (difference Delta) and isotropic variances s_1, s_0. The noise of class y
has variance u_y along Delta and v_y in every orthogonal direction; the four are chosen to
minimise the symmetrised KL divergence between the noised classes,

    1/2 [a1/a0 + a0/a1 + (D - 1)(b1/b0 + b0/b1) + |Delta|^2 (1/a0 + 1/a1) - 2D],
    a_y = s_y + u_y, b_y = s_y + v_y,

under the expected power p (u_1 + (D - 1) v_1) + (1 - p)(u_0 + (D - 1) v_0) <= scale |Delta|^2
(p the batch's positive share; ``scale`` the run config's ``marvell``). Solved with SciPy's SLSQP,
in units of |Delta|^2. A batch with one label only gets no noise (no Delta to hide); the solve
reads five numbers to the host per step.
"""

from __future__ import annotations

import numpy as np
import torch


def sum_kl(x: np.ndarray, d: int, delta2: float, s0: float, s1: float) -> float:
    """The symmetrised KL divergence of the two noised classes for noise (u0, u1, v0, v1) = x."""
    u0, u1, v0, v1 = x
    a0, a1, b0, b1 = s0 + u0, s1 + u1, s0 + v0, s1 + v1
    return 0.5 * (a1 / a0 + a0 / a1 + (d - 1) * (b1 / b0 + b0 / b1) + delta2 * (1 / a0 + 1 / a1) - 2 * d)


def power(x: np.ndarray, d: int, p1: float) -> float:
    u0, u1, v0, v1 = x
    return p1 * (u1 + (d - 1) * v1) + (1 - p1) * (u0 + (d - 1) * v0)


def optimal_noise(d: int, s0: float, s1: float, p1: float, budget: float) -> np.ndarray:
    """(u0, u1, v0, v1) minimising :func:`sum_kl` with |Delta|^2 = 1 (everything in its units)
    under ``power <= budget``; starts from the whole budget along Delta for both classes."""
    from scipy.optimize import minimize  # lazy: ~0.25 s of every ServerApp's start; this defence only

    s0, s1 = max(s0, 1e-9), max(s1, 1e-9)
    x0 = np.array([budget, budget, 0.0, 0.0])
    res = minimize(
        sum_kl,
        x0,
        args=(d, 1.0, s0, s1),
        method="SLSQP",
        bounds=[(0.0, None)] * 4,
        constraints=[{"type": "ineq", "fun": lambda x: budget - power(x, d, p1)}],
    )
    best = res.x if res.success and power(res.x, d, p1) <= budget * (1 + 1e-6) else x0
    return np.maximum(best, 0.0)


def marvell_noise(per: torch.Tensor, labels: torch.Tensor, scale: float, gen: torch.Generator) -> torch.Tensor:
    """Noise (B, D) for the records' gradient shares ``per`` (B, D) with binary ``labels`` (B,)."""
    pos = labels > 0.5  # (B,)
    n1 = int(pos.sum())
    if n1 in (0, len(pos)):
        return torch.zeros_like(per)
    delta = per[pos].mean(0) - per[~pos].mean(0)  # (D,)
    delta2 = float(delta @ delta)
    if delta2 == 0:
        return torch.zeros_like(per)
    s1, s0 = (float(per[m].var(0, unbiased=False).mean()) / delta2 for m in (pos, ~pos))
    u0, u1, v0, v1 = optimal_noise(per.shape[1], s0, s1, n1 / len(pos), scale) * delta2
    unit = delta / delta2**0.5  # (D,)
    z = torch.randn(per.shape, generator=gen, device=per.device, dtype=per.dtype)  # (B, D)
    along = z @ unit  # (B,)
    u = torch.where(pos, u1, u0).to(per.dtype) ** 0.5  # (B,)
    v = torch.where(pos, v1, v0).to(per.dtype) ** 0.5
    return (u * along)[:, None] * unit + v[:, None] * (z - along[:, None] * unit)
