"""The checks every reader of another party's message applies, in both training modes: no field
the protocol lacks, names that are plain folder names, finite values. A refusal names the sender.

    plain_name(value, what, message) -> str
    expect_fields(record, allowed, message)
    require_finite(values, party, what, message)
"""

from __future__ import annotations

import re

import numpy as np


class PeerValueError(ValueError):
    """A tensor from another party that this party refuses (its sender named)."""


class NonFiniteValues(PeerValueError):
    """A tensor with NaN or infinite values; refused before it touches any weights."""


class ProtocolError(ValueError):
    """A message with a field the protocol does not have (e.g. a path), or a name that is not plain."""


PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=,@-]{0,127}")


def plain_name(value: object, what: str, message: str) -> str:
    """``value`` if it is one plain folder name (no separator, not '.' or '..', no leading dot or dash)."""
    name = str(value)
    if not PLAIN_NAME.fullmatch(name) or ".." in name:
        raise ProtocolError(
            f"{message}: refusing {what} {name!r}: it must be one plain folder name "
            "(letters, digits, _ . + = , @ -; no path)"
        )
    return name


def expect_fields(record, allowed: set[str], message: str) -> None:
    """Refuse fields the protocol does not define (a primary must not steer a party's paths)."""
    unknown = sorted(set(record) - allowed)
    if unknown:
        raise ProtocolError(
            f"{message} carries field(s) {unknown} that the protocol does not have (expected "
            f"{sorted(allowed)}); a party reads and writes only under its own configured folders"
        )


def require_finite(values, party: str, what: str, message: str) -> None:
    """Refuse a numpy array or torch tensor holding NaN or infinite values."""
    if hasattr(values, "isfinite"):  # torch
        bad, total = int((~values.isfinite()).sum()), values.numel()
    else:
        values = np.asarray(values)
        bad = int((~np.isfinite(values)).sum()) if values.dtype.kind in "fc" else 0
        total = values.size
    if bad:
        raise NonFiniteValues(
            f"party {party!r}: {what} in {message} has {bad} of {total} values non-finite "
            "(NaN or inf); refused, nothing applied"
        )
