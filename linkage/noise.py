"""Noise for the released similarities: its scale (Theorem 2's attack bound, Theorem 1's DP
sigma) and its draws, keyed by the job's secret and each record's identifiers."""

from __future__ import annotations

import hashlib
import math

import numpy as np
from scipy.optimize import brentq
from scipy.special import erf

from linkage.contracts import LinkageError, identifier_bytes


def sigma_from_tau(tau: float, raw_std: float, radius: float = 0.5) -> float:
    """Noise scale sigma for an attack-success bound tau (paper Theorem 2).

    Solves erf(sqrt(sigma^2 + 1) / (2 sqrt(2) sigma sigma0)) = tau, sigma0 = std of the raw
    similarities in units of 2 * radius: the theorem counts a distance guessed within half a unit,
    here within ``radius`` (identifier units; the paper's 0.5 by default; contracts.Defences).
    tau = 1 means no noise. As sigma grows the left side falls to erf(1 / (2 sqrt(2) sigma0));
    a tau at or below that floor cannot be reached.
    """
    if not 0.0 < tau <= 1.0:
        raise LinkageError(f"tau must be in (0, 1], got {tau}")
    if tau == 1.0:
        return 0.0
    raw_std = raw_std / (2.0 * radius)
    floor = float(erf(1.0 / (2.0 * math.sqrt(2.0) * raw_std)))
    if tau <= floor:
        raise LinkageError(
            f"tau={tau} is unreachable: with raw similarity std {raw_std * 2.0 * radius:.4g} and privacy radius "
            f"{radius:g} the attack bound never falls below {floor:.6g} (paper Theorem 2); choose tau above it, "
            "or a smaller radius (docs/privacy.md)"
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


def record_noise(secret: bytes, party: str, ids, shape: tuple[int, int], sigma: float) -> np.ndarray:
    """(m, P) N(0, sigma) noise; row i is a function of (the job's secret, the party, record i's
    identifiers) alone, so a record gets the same noise in the job's release and in any later
    query, whatever the batch. Prefix-stable: column j does not depend on P.

    Per record: SHAKE-256 of a key derived from the secret and the record's identifier bytes
    gives 16 bytes per column, two little-endian 53-bit uniforms, Box-Muller."""
    m, p = shape
    if sigma == 0.0:
        return np.zeros(shape)
    key = hashlib.sha256(b"fedsim-linkage-noise|" + secret + b"|" + party.encode()).digest()
    ids = np.asarray(ids)
    raw = b"".join(hashlib.shake_256(key + identifier_bytes(ids[i:i + 1])).digest(16 * p) for i in range(m))
    bits = np.frombuffer(raw, dtype="<u8").reshape(m, p, 2)
    u = (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53  # [0, 1), 53 bits each
    u1, u2 = 1.0 - u[..., 0], u[..., 1]  # u1 in (0, 1]: the log is finite
    return sigma * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)  # Box-Muller, (m, P)
