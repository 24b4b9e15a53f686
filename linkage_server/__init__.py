"""Soft linkage: top-K similar secondary records per primary record, normalised and noised.

The pipeline is a chain of small pure functions with array contracts (see
:mod:`linkage_server.pipeline`); :func:`link` composes them and :mod:`linkage_server.store`
persists the two views (primary: tokens + similarities; secondary: token -> row).
"""

from linkage_server.pipeline import (
    LinkageError,
    LinkageResult,
    PrimaryLinkage,
    SecondaryLinkage,
    link,
    sigma_from_tau,
    topk_bruteforce,
    topk_euclidean,
)

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
