"""Noise scales for the released similarities: Theorem 2's attack bound and Theorem 1's DP sigma."""

from __future__ import annotations

import math

from scipy.optimize import brentq
from scipy.special import erf

from linkage.contracts import LinkageError


def sigma_from_tau(tau: float, raw_std: float) -> float:
    """Noise scale sigma for an attack-success bound tau (paper Theorem 2).

    Solves erf(sqrt(sigma^2 + 1) / (2 sqrt(2) sigma sigma0)) = tau, sigma0 = std of the raw
    similarities. tau = 1 means no noise. As sigma grows the left side falls to
    erf(1 / (2 sqrt(2) sigma0)); a tau at or below that floor cannot be reached.
    """
    if not 0.0 < tau <= 1.0:
        raise LinkageError(f"tau must be in (0, 1], got {tau}")
    if tau == 1.0:
        return 0.0
    floor = float(erf(1.0 / (2.0 * math.sqrt(2.0) * raw_std)))
    if tau <= floor:
        raise LinkageError(
            f"tau={tau} is unreachable: with raw similarity std {raw_std:.4g} the attack bound never "
            f"falls below {floor:.6g} (paper Theorem 2); choose tau above it"
        )

    def gap(log_sigma: float) -> float:
        s = math.exp(log_sigma)
        return float(erf(math.sqrt(s * s + 1.0) / (2.0 * math.sqrt(2.0) * s * raw_std))) - tau

    # gap decreases in sigma; bracket in log space
    return math.exp(brentq(gap, math.log(1e-12), math.log(1e12), xtol=1e-12))


def dp_sigma(n: int, mu0: float, sigma0: float, eps: float = 1.0) -> float:
    """The smallest sigma an (eps, delta)-DP release of the similarities needs (paper Theorem 1).

    Delta_G = n * max(|(1 + mu0) / sigma0|, |(-1 + mu0) / sigma0|), sigma >= Delta_G / sqrt(2 eps),
    with mu0, sigma0 the mean and std of the raw similarities. It grows with n, the size of the
    secondary party: in practice it drowns the similarities, which is why the paper (and we)
    calibrate to Theorem 2's attack bound instead, and report this number for reference.
    """
    if eps <= 0:
        raise LinkageError(f"eps must be > 0, got {eps}")
    delta_g = n * max(abs((1.0 + mu0) / sigma0), abs((-1.0 + mu0) / sigma0))
    return delta_g / math.sqrt(2.0 * eps)
