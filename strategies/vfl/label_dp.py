"""Label DP for a regression target: randomised response on bins (after Ghazi et al.,
"Regression with Label Differential Privacy", ICLR 2023), made unbiased, the primary's defence of
its training labels when the task is regression (run config ``label-dp``; strategies/vfl/defences.py
has the classes' randomised response).

The target, scaled to [0, 1], is released as one of m values v_1 < ... < v_m: a label y is first
rounded to one of the two values around it, at random so that the rounding's mean is y
(stochastic rounding; labels outside [v_1, v_m] go to the end), and that value is sent with
probability p = e^eps / (e^eps + m - 1), else one of the other m - 1 values uniformly. Whatever
the rounding, each value is sent with probability between q = (1 - p) / (m - 1) and p = e^eps q:
epsilon-label-DP. The primary trains on (sent - q sum(v)) / (p - q) (:func:`unbias`, a function of
the release: post-processing), whose mean given the label is the label itself, so a model
trained on it learns the true regression function, only more noisily. (Trained on the raw
release, or on Laplace noise clipped back to [0, 1], a model learns labels pulled towards their
middle: hdb at epsilon 2, test RMSE 90-94 against 38.)

m and the values (quantiles of a prior of the labels) are chosen to minimise that unbiased
release's expected variance (:func:`release_variance`). The prior is the labels' histogram over
:data:`BINS` bins with Laplace noise, which spends :data:`PRIOR_SHARE` of epsilon (one label
moves one count by 1); the rest goes to the response: epsilon-label-DP by sequential composition.
"""

from __future__ import annotations

import math

import numpy as np

BINS = 100  # equal-width bins of [0, 1] for the prior
MAX_OUTPUTS = 32  # the most release values tried
PRIOR_SHARE = 0.1  # of epsilon, spent on the prior's histogram
TAIL = 0.005  # the values span the prior's quantiles TAIL .. 1 - TAIL


def noisy_prior(y: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """(BINS,) the labels' ([0, 1]) histogram plus Laplace(1 / epsilon) per bin, clipped at 0 and
    normalised (uniform if nothing is left)."""
    counts = np.bincount(np.clip((y * BINS).astype(int), 0, BINS - 1), minlength=BINS).astype(float)
    noisy = np.maximum(counts + rng.laplace(scale=1.0 / epsilon, size=BINS), 0.0)
    return noisy / noisy.sum() if noisy.sum() > 0 else np.full(BINS, 1.0 / BINS)


def send_rates(m: int, epsilon: float) -> tuple[float, float]:
    """(p, q): the chance of sending the rounded value, and each other value's."""
    p = math.exp(epsilon) / (math.exp(epsilon) + m - 1)
    return p, (1.0 - p) / (m - 1)


def randomised_response(index: np.ndarray, k: int, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """k-ary randomised response on ``index`` (n,) in [0, k): each kept with probability p
    (:func:`send_rates`), else one of the other k - 1 uniformly."""
    keep = rng.random(len(index)) < send_rates(k, epsilon)[0]
    other = (index + rng.integers(1, k, size=len(index))) % k  # uniform over the k - 1 others
    return np.where(keep, index, other)


def candidate_values(prior: np.ndarray, m: int) -> np.ndarray:
    """m distinct values: the prior's quantiles at m levels from TAIL to 1 - TAIL (bin centres)."""
    centres = (np.arange(BINS) + 0.5) / BINS
    levels = np.linspace(TAIL, 1.0 - TAIL, m)
    return np.unique(centres[np.minimum(np.searchsorted(np.cumsum(prior), levels), BINS - 1)])


def rounding(y: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per label (n,) the index of the value below it and the chance of rounding up instead:
    the rounding's mean is y, clipped into [v_1, v_m]."""
    y = np.clip(y, values[0], values[-1])
    low = np.clip(np.searchsorted(values, y, side="right") - 1, 0, len(values) - 2)  # (n,)
    up = (y - values[low]) / (values[low + 1] - values[low])
    return low, up


def release_variance(prior: np.ndarray, values: np.ndarray, epsilon: float) -> float:
    """The unbiased release's expected squared error against the label under ``prior``: the
    clipping's bias squared, the rounding's variance, and the response's variance / (p - q)^2."""
    centres = (np.arange(BINS) + 0.5) / BINS
    m = len(values)
    p, q = send_rates(m, epsilon)
    low, up = rounding(centres, values)
    clipped = np.clip(centres, values[0], values[-1])
    sent_sq, sent_mean = q * (values**2).sum(), q * values.sum()  # E[sent^2 | v_j] = that + (p - q) v_j^2
    per_value = sent_sq + (p - q) * values**2 - (sent_mean + (p - q) * values) ** 2  # (m,) Var(sent | v_j)
    response = (1 - up) * per_value[low] + up * per_value[low + 1]  # (BINS,)
    round_var = up * (1 - up) * (values[low + 1] - values[low]) ** 2
    err = (clipped - centres) ** 2 + round_var + response / (p - q) ** 2
    return float((prior * err).sum())


def unbias(sent: np.ndarray, values: np.ndarray, epsilon: float) -> np.ndarray:
    """Released values -> (sent - q sum(values)) / (p - q): E[sent | v] = (p - q) v + q sum(values),
    so this has the rounded value's mean, which is the label's."""
    p, q = send_rates(len(values), epsilon)
    return (sent - q * values.sum()) / (p - q)


def rr_on_bins(y: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """epsilon-label-DP, unbiased release of ``y`` (n,) in [0, 1] (module docstring): what the
    primary trains on, outside [0, 1] at times."""
    prior = noisy_prior(y, PRIOR_SHARE * epsilon, rng)
    eps = (1.0 - PRIOR_SHARE) * epsilon
    candidates = [v for v in (candidate_values(prior, m) for m in range(2, MAX_OUTPUTS + 1)) if len(v) > 1]
    values = min(candidates, key=lambda v: release_variance(prior, v, eps))
    low, up = rounding(y, values)
    own = low + (rng.random(len(y)) < up)  # (n,) the rounded value's index
    return unbias(values[randomised_response(own, len(values), eps, rng)], values, eps)
