"""Label DP for a regression target: randomised response on bins (Ghazi et al., "Regression with
Label Differential Privacy", ICLR 2023), the primary's defence of its training labels when the
task is regression (run config ``label-dp``; strategies/vfl/defences.py for the classes' RR).

The target, scaled to [0, 1], is released as one of m values yhat_1 < ... < yhat_m: a label y
maps to phi(y) (the nearest), which is sent with probability p = e^eps / (e^eps + m - 1), else one
of the other m - 1 values uniformly. Whatever m, the values and phi, that is k-ary randomised
response on phi(y): epsilon-label-DP. The values are chosen to minimise the expected squared
error of the released label under a prior of the labels: Lloyd's alternation (phi = nearest
value; each value = the mean of the labels weighted by how often it is sent for them), for every
m up to :data:`MAX_OUTPUTS`, keeping the best. m = 1 releases the prior's mean: no label used.

The prior is the labels' histogram over :data:`BINS` bins with Laplace noise, which spends
:data:`PRIOR_SHARE` of epsilon (one label moves one count by 1); the rest goes to the response,
so the whole release is epsilon-label-DP by sequential composition.
"""

from __future__ import annotations

import math

import numpy as np

BINS = 100  # equal-width bins of [0, 1] for the prior
MAX_OUTPUTS = 32  # the most release values tried
PRIOR_SHARE = 0.1  # of epsilon, spent on the prior's histogram
ITERATIONS = 50  # Lloyd's steps per m


def noisy_prior(y: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """(BINS,) the labels' ([0, 1]) histogram plus Laplace(1 / epsilon) per bin, clipped at 0 and
    normalised (uniform if nothing is left)."""
    counts = np.bincount(np.minimum((y * BINS).astype(int), BINS - 1), minlength=BINS).astype(float)
    noisy = np.maximum(counts + rng.laplace(scale=1.0 / epsilon, size=BINS), 0.0)
    return noisy / noisy.sum() if noisy.sum() > 0 else np.full(BINS, 1.0 / BINS)


def send_rates(m: int, epsilon: float) -> tuple[float, float]:
    """(p, q): the chance of sending a label's own value, and each other value's."""
    p = math.exp(epsilon) / (math.exp(epsilon) + m - 1)
    return p, (1.0 - p) / (m - 1) if m > 1 else 0.0


def fit_values(prior: np.ndarray, epsilon: float, m: int) -> tuple[np.ndarray, float]:
    """The m release values (m,) for ``prior`` over the bins' centres, and their expected squared
    error (Lloyd's alternation from the prior's quantiles)."""
    centres = (np.arange(BINS) + 0.5) / BINS  # (BINS,)
    p, q = send_rates(m, epsilon)
    cdf = np.cumsum(prior)
    values = centres[np.minimum(np.searchsorted(cdf, (np.arange(m) + 0.5) / m), BINS - 1)]  # (m,)
    for _ in range(ITERATIONS):
        own = np.abs(centres[:, None] - values[None, :]).argmin(1)  # (BINS,) phi per bin
        w = np.where(own[:, None] == np.arange(m)[None, :], p, q) * prior[:, None]  # (BINS, m)
        new = np.where(w.sum(0) > 0, (w * centres[:, None]).sum(0) / np.maximum(w.sum(0), 1e-300), values)
        if np.allclose(new, values, atol=1e-12):
            break
        values = np.sort(new)
    own = np.abs(centres[:, None] - values[None, :]).argmin(1)
    w = np.where(own[:, None] == np.arange(m)[None, :], p, q) * prior[:, None]  # (BINS, m)
    return values, float((w * (values[None, :] - centres[:, None]) ** 2).sum())


def rr_on_bins(y: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """epsilon-label-DP release of ``y`` (n,) in [0, 1] (module docstring): the released values."""
    prior = noisy_prior(y, PRIOR_SHARE * epsilon, rng)
    eps = (1.0 - PRIOR_SHARE) * epsilon
    values, _ = min((fit_values(prior, eps, m) for m in range(1, MAX_OUTPUTS + 1)), key=lambda v: v[1])
    m = len(values)
    own = np.abs(np.clip(y, 0.0, 1.0)[:, None] - values[None, :]).argmin(1)  # (n,) phi(y)
    if m == 1:
        return np.full(len(y), values[0])
    p, _ = send_rates(m, eps)
    keep = rng.random(len(y)) < p
    other = (own + rng.integers(1, m, size=len(y))) % m  # uniform over the m - 1 others
    return values[np.where(keep, own, other)]
