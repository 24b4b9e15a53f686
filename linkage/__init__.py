"""Soft linkage: top-K similar secondary records per primary record, normalised and noised.

The pipeline is a chain of small pure functions with array contracts (see
:mod:`linkage.pipeline`); :func:`link` composes them and :mod:`linkage.store`
persists the two views (primary: tokens + similarities; secondary: token -> row).
"""

import importlib

# Exports resolved on first use (PEP 562): importing a light submodule (linkage.contracts in a
# deployed secondary's every message) does not import the pipeline and scipy with it.
_EXPORTS = {
    "LinkageError": "linkage.contracts",
    "LinkageResult": "linkage.contracts",
    "PrimaryLinkage": "linkage.contracts",
    "SecondaryLinkage": "linkage.contracts",
    "link": "linkage.pipeline",
    "sigma_from_tau": "linkage.pipeline",
    "topk_bruteforce": "linkage.pipeline",
    "topk_euclidean": "linkage.pipeline",
}

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


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'linkage' has no attribute {name!r}")
