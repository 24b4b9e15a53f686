"""Private set intersection of entity ids: which of one party's ids another party holds, with
neither sending its ids (Diffie-Hellman over X25519, semi-honest; the EA paper's "PSI" step).

    Blinder()                    a party's secret exponent, drawn from the OS's randomness, never sent
    blinder.blind(ids (n,))      -> (n, 32) uint8: each id hashed onto the curve, raised to the secret
    blinder.reblind(points, who) -> (n, 32) uint8: another party's blinded points raised to the secret
    matches(mine, theirs)        -> (n,) int64: the row of ``theirs`` equal to each of ``mine``, -1 none

The exchange (app/entity_aug/id_exchange.py): the label holder L sends B = blind_L(its ids); a
guest G answers A = blind_G(its ids) and reblind_G(B); L reblinds A and matches. Raising to both
secrets commutes, so an id both hold gives the same 32 bytes on both sides; an id one party alone
holds stays a point blinded by the other's secret. L learns how many ids G holds and which of its
own ids G holds (and G's row of each); G learns how many ids L holds, and later, from the plan L
sends, which of its rows are the run's entities. Semi-honest: a label holder that blinds guessed
ids learns which of the guesses a guest holds, as any PSI whose result it receives.
"""

from __future__ import annotations

import hashlib

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

POINT = 32  # bytes of an X25519 u-coordinate
DOMAIN = b"fedsim entity-id psi v1\x00"  # separates these hashes from any other use of the ids


class PsiError(ValueError):
    """A peer's points are not points: wrong shape or type, or of small order (a value no honest
    blinding gives)."""


def hash_to_point(entity_id: str) -> bytes:
    """(32,) the id's u-coordinate: SHA-256 of the domain and the id's UTF-8 text."""
    return hashlib.sha256(DOMAIN + str(entity_id).encode("utf-8")).digest()


class Blinder:
    """One party's secret exponent for one exchange (a fresh one per run)."""

    def __init__(self) -> None:
        self._key = X25519PrivateKey.generate()  # the OS's randomness; never leaves this object

    def _raise(self, u: bytes) -> bytes:
        return self._key.exchange(X25519PublicKey.from_public_bytes(u))

    def blind(self, ids) -> np.ndarray:
        """(n, 32) uint8: each id's point raised to this party's secret, in the ids' order."""
        return _points([self._raise(hash_to_point(i)) for i in ids])

    def reblind(self, points, sender: str) -> np.ndarray:
        """(n, 32) uint8: ``sender``'s blinded points raised to this party's secret, in their order;
        refused, naming the sender, unless they are (n, 32) bytes of points of large order."""
        arr = np.asarray(points)
        if arr.dtype != np.uint8 or arr.ndim != 2 or arr.shape[1] != POINT:
            raise PsiError(f"{sender}: blinded ids must be (n, {POINT}) uint8, got {arr.dtype} {arr.shape}")
        out = []
        for row, u in enumerate(arr):
            try:
                out.append(self._raise(u.tobytes()))
            except ValueError as err:  # the all-zero result of a small-order point
                raise PsiError(f"{sender}: blinded id {row} is not a point of large order ({err})") from None
        return _points(out)


def matches(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """(n,) int64: for each doubly blinded id of ``mine`` the row of ``theirs`` with the same
    bytes, -1 where none (an id only one side holds)."""
    where = {bytes(p): row for row, p in enumerate(np.asarray(theirs, dtype=np.uint8))}
    if len(where) != len(theirs):
        raise PsiError("two of the other side's doubly blinded ids are equal: a repeated id")
    return np.array([where.get(bytes(p), -1) for p in np.asarray(mine, dtype=np.uint8)], dtype=np.int64)


def _points(values: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(values), dtype=np.uint8).reshape(len(values), POINT).copy()
