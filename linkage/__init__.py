"""Soft linkage: top-K similar secondary records per primary record, normalised and noised.

The pipeline is a chain of small pure functions with array contracts (see
:mod:`linkage.pipeline`); :func:`link` composes them and :mod:`linkage.store`
persists the two views (primary: tokens + similarities; secondary: token -> row).
"""

from linkage.contracts import (
    LinkageError,
    LinkageResult,
    PrimaryLinkage,
    SecondaryLinkage,
)
from linkage.pipeline import link, sigma_from_tau, topk_bruteforce, topk_euclidean

__all__ = [
    "LinkageError",
    "LinkageResult",
    "PrimaryLinkage",
    "SecondaryLinkage",
    "link",
    "sigma_from_tau",
    "topk_bruteforce",
    "topk_euclidean",
]
