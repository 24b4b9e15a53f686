"""Noise for the released similarities: its scale (Theorem 2's attack bound, Theorem 1's DP
sigma) and its draws, keyed by the job's secret and each record's identifiers."""

from __future__ import annotations

import hashlib
import math
from typing import Iterable

import numpy as np

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
    floor = float(math.erf(1.0 / (2.0 * math.sqrt(2.0) * raw_std)))
    if tau <= floor:
        raise LinkageError(
            f"tau={tau} is unreachable: with raw similarity std {raw_std * 2.0 * radius:.4g} and privacy radius "
            f"{radius:g} the attack bound never falls below {floor:.6g} (paper Theorem 2); choose tau above it, "
            "or a smaller radius (docs/privacy.md)"
        )

    def gap(log_sigma: float) -> float:
        s = math.exp(log_sigma)
        return float(math.erf(math.sqrt(s * s + 1.0) / (2.0 * math.sqrt(2.0) * s * raw_std))) - tau

    from scipy.optimize import brentq  # lazy: scipy.optimize costs every process that imports the release ~0.25 s

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


def canonical_ids(ids) -> np.ndarray:
    """The identifiers as the noise is keyed by them: numbers as float64 with -0.0 made 0.0 (the
    same point, which contracts.identifier_bytes would tell apart), strings and packed bits as they are."""
    ids = np.asarray(ids)
    if ids.dtype.kind in "UO" or ids.dtype == np.uint8:
        return ids
    return ids.astype(np.float64) + 0.0  # x + 0.0 is x bitwise, except -0.0 + 0.0 = 0.0


def _gaussian(key: bytes, rows: Iterable[bytes], p: int, sigma: float) -> np.ndarray:
    """(m, P) N(0, sigma): per row, SHAKE-256 of key + the row's bytes gives 16 bytes per column,
    two little-endian 53-bit uniforms, Box-Muller. Prefix-stable: column j does not depend on P."""
    raw = bytearray()
    for row in rows:
        raw += hashlib.shake_256(key + row).digest(16 * p)
    bits = np.frombuffer(raw, dtype="<u8").reshape(-1, p, 2)
    u1 = 1.0 - (bits[..., 0] >> np.uint64(11)).astype(np.float64) * 2.0**-53  # (0, 1], 53 bits: the log is finite
    u2 = (bits[..., 1] >> np.uint64(11)).astype(np.float64) * 2.0**-53  # [0, 1)
    return sigma * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)  # Box-Muller, (m, P)


def record_noise(secret: bytes, party: str, ids, shape: tuple[int, int], sigma: float) -> np.ndarray:
    """(m, P) N(0, sigma) noise; row i is a function of (the job's secret, the party, record i's
    identifiers) alone, so a record gets the same noise in the job's release and in any later
    query, whatever the batch (and ``-0.0`` the noise of ``0.0``: :func:`canonical_ids`)."""
    m, p = shape
    if sigma == 0.0:
        return np.zeros(shape)
    key = hashlib.sha256(b"fedsim-linkage-noise|" + secret + b"|" + party.encode()).digest()
    ids = canonical_ids(ids)
    return _gaussian(key, (identifier_bytes(ids[i : i + 1]) for i in range(m)), p, sigma)


def selection_noise(secret: bytes, party: str, dist: np.ndarray, idx: np.ndarray, sigma: float) -> np.ndarray:
    """(c, P) N(0, sigma) noise for choosing K of a record's P pool candidates (linkage.release):
    row i is a function of (the job's secret, the party, record i's pool: its candidates' rows and
    distances) alone, so a record gets the same choice in the release and in every query, and a
    release can be planned from the search's chunks before any identifier is read."""
    key = hashlib.sha256(b"fedsim-linkage-select|" + secret + b"|" + party.encode()).digest()
    dist = np.ascontiguousarray(dist, np.float64) + 0.0  # -0.0 = 0.0
    idx = np.ascontiguousarray(idx, np.int64)
    return _gaussian(key, (dist[i].tobytes() + idx[i].tobytes() for i in range(len(dist))), dist.shape[1], sigma)
