"""The checks every reader of another party's message applies, in both training modes: no field
the protocol lacks, names that are plain folder names, finite values. A refusal names the sender.

    plain_name(value, what, message) -> str
    peer_integer(value) -> int | None
    read_count(fields, key, message, low=0) -> int
    read_number(fields, key, message) -> float
    read_text(fields, key, message) -> str
    expect_fields(record, allowed, message)
    require_finite(values, party, what, message)
    check_block(values, Expect(sender, what, message, shape, dtype)) -> values (numpy, unchanged)

What a party accepts of another party's tensors (:func:`check_block`): exactly the shape it
asked for, in its own compute dtype, finite, and within a bound it states. A refusal names the
sender, the message and the field, what was expected and what came; nothing is applied before
every block is checked. Why a bound and not only finiteness: a value that is finite as sent can
still poison the receiver's arithmetic (3.4e38, float32's largest, squared or summed over K x c
products is inf, and then every weight NaN). EXCHANGE_BOUND = 1e6: honest embeddings,
activations and cut-layer gradients are O(1) to O(100) (a party's MLP output; the gradient of a
batch-mean loss), so 1e6 refuses nothing honest, while 1e6 summed over K = 1000 neighbours of
c = 1000 products with weights of 1e3 is 1e15, squared 1e30, under float32's 3.4e38: no sum or
square of accepted values overflows. FedSim's tensors that an in-process channel hands over (one
process, no other party, torch tensors) are not checked.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


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


def peer_integer(value) -> int | None:
    """``value`` as an int when it is one: an int, or a float with no fraction (a record may carry
    one); None for anything else (a bool, a string, bytes, a fraction, NaN or inf), which the
    reader refuses by name rather than coercing (``int(2.9)`` is 2, ``int(True)`` 1)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def read_count(fields, key: str, message: str, low: int = 0) -> int:
    """``fields[key]`` as an int >= ``low`` (a step, an epoch, a count), else refused naming
    ``message`` (which names the sender) and the field; a missing field is refused the same way."""
    if key not in fields:
        raise ProtocolError(f"{message}: field {key!r} is missing (an integer >= {low})")
    value = peer_integer(fields[key])
    if value is None or value < low:
        raise ProtocolError(f"{message}: field {key!r} must be an integer >= {low}, got {fields[key]!r}")
    return value


def read_number(fields, key: str, message: str) -> float:
    """``fields[key]`` as a finite float when it is a number (an int or a float, never a bool or a
    string), else refused naming ``message`` (which names the sender) and the field."""
    value = fields.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ProtocolError(f"{message}: field {key!r} must be a finite number, got {value!r}")
    return float(value)


def read_text(fields, key: str, message: str) -> str:
    """``fields[key]`` when it is a string, else refused naming ``message`` and the field."""
    value = fields.get(key)
    if not isinstance(value, str):
        raise ProtocolError(f"{message}: field {key!r} must be a string, got {value!r}")
    return value


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


EXCHANGE_BOUND = 1e6  # the largest |value| accepted in an exchanged embedding or gradient (module docstring)


@dataclass(frozen=True)
class Expect:
    """What a receiver asked for: from ``sender`` ("party 'school'", "the primary"), field
    ``what`` of ``message``, of ``shape`` in ``dtype`` (the receiver's compute dtype)."""

    sender: str
    what: str
    message: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    receiver: str = ""  # the receiving party's name; "" = the primary
    bound: float = EXCHANGE_BOUND

    def refuse(self, why: str, kind: type = PeerValueError) -> PeerValueError:
        who = f"party {self.receiver!r}" if self.receiver else "the primary"
        return kind(f"{who}: {self.what} from {self.sender} in {self.message}: {why}; refused, nothing applied")


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    import torch  # lazy: a torch dtype was given, so torch is loaded; the wire's readers need none (handshakes)

    return torch.empty((), dtype=dtype).numpy().dtype


def check_block(values, expect: Expect):
    """``values`` if it is a numpy array of exactly ``expect``'s shape and dtype whose values are
    finite and within the bound; a torch tensor (an in-process channel's) is returned as it is."""
    torch = sys.modules.get("torch")  # not imported: ``values`` cannot be a tensor
    if torch is not None and isinstance(values, torch.Tensor):
        return values
    if not isinstance(values, np.ndarray):
        raise expect.refuse(f"expected an array, got {type(values).__name__}")
    want = numpy_dtype(expect.dtype)
    if values.dtype != want:
        raise expect.refuse(f"dtype {values.dtype}, expected {want} (the receiver's compute dtype; no conversion)")
    if values.shape != tuple(expect.shape):
        raise expect.refuse(f"shape {values.shape}, expected {tuple(expect.shape)}")
    if values.size:
        finite = np.isfinite(values)
        if not finite.all():
            raise expect.refuse(
                f"{int((~finite).sum())} of {values.size} values non-finite (NaN or inf)", NonFiniteValues
            )
        top = float(np.abs(values).max())
        if top > expect.bound:
            raise expect.refuse(f"a value of magnitude {top:.3g}, over the receiver's bound {expect.bound:g}")
    return values
