"""A core type's codec, (numpy arrays, plain scalars), as one bytes body for a direct link
(app/secure_link.py), without Flower's records: a step's request and reply cross a link in
microseconds where a RecordDict's protobuf, with each array saved and loaded as a .npy file,
took ~0.3 ms a message (docs/benchmarks.md "Entity Augmentation's step without Flower's records").

    pack((arrays, fields)) -> bytes
    unpack(body, message) -> (arrays, fields)
    array_bytes(arrays) -> int (what the protocol moves, for the traffic record)

Layout: header length (4 bytes, big-endian) | header, JSON {"fields": {name: scalar},
"arrays": [[name, dtype, shape], ...]} | each array's bytes in that order, C order. The reader
refuses, naming ``message``, anything but exactly that: a dtype outside :data:`DTYPES`, a shape
that is not a few non-negative integers, a field that is not a plain scalar, bytes missing or
left over. Values (finite, in range) are the decoding type's to check, as for every reader.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np

from strategies.wire_checks import ProtocolError

_LENGTH = struct.Struct(">I")
MAX_HEADER = 64 << 10  # bytes: names, dtypes, shapes and scalars, never tensors
MAX_DIMS = 4
DTYPES = frozenset(np.dtype(t).str for t in ("<f2", "<f4", "<f8", "<i4", "<i8", "|u1", "|b1"))


def pack(codec: tuple[dict[str, np.ndarray], dict]) -> bytes:
    arrays, fields = codec
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    spec = [[k, v.dtype.str, list(v.shape)] for k, v in arrays.items()]
    head = json.dumps({"fields": fields, "arrays": spec}, allow_nan=True).encode()
    return b"".join([_LENGTH.pack(len(head)), head, *(v.tobytes() for v in arrays.values())])


def array_bytes(arrays: dict[str, np.ndarray]) -> int:
    return sum(a.nbytes for a in arrays.values())


def unpack(body: bytes, message: str) -> tuple[dict[str, np.ndarray], dict]:
    """``body``'s arrays (writable copies) and fields; ProtocolError naming ``message`` otherwise."""
    if len(body) < _LENGTH.size:
        raise ProtocolError(f"{message}: {len(body)} bytes, too short for a header")
    (n,) = _LENGTH.unpack_from(body)
    if n > min(MAX_HEADER, len(body) - _LENGTH.size):
        raise ProtocolError(f"{message}: a header of {n} bytes (at most {MAX_HEADER}, within the body)")
    head = _header(body[_LENGTH.size : _LENGTH.size + n], message)
    arrays, at = {}, _LENGTH.size + n
    for name, dtype, shape in head["arrays"]:
        size = math.prod(shape) * dtype.itemsize
        if at + size > len(body):
            raise ProtocolError(f"{message}: array {name!r} {dtype} {tuple(shape)} runs past the body's end")
        arrays[name] = np.frombuffer(body, dtype, math.prod(shape), at).reshape(shape).copy()
        at += size
    if at != len(body):
        raise ProtocolError(f"{message}: {len(body) - at} bytes after the last array")
    return arrays, head["fields"]


def _header(raw: bytes, message: str) -> dict:
    try:
        head = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # RecursionError: a header nested deep
        raise ProtocolError(f"{message}: a header that does not parse: {e}") from e
    if not isinstance(head, dict) or set(head) != {"fields", "arrays"}:
        raise ProtocolError(f"{message}: a header without exactly 'fields' and 'arrays'")
    fields, spec = head["fields"], head["arrays"]
    if not isinstance(fields, dict) or not all(_scalar(v) for v in fields.values()):
        raise ProtocolError(f"{message}: fields must be plain scalars, got {fields!r:.200}")
    if not isinstance(spec, list):
        raise ProtocolError(f"{message}: 'arrays' must be a list")
    head["arrays"] = [_array_spec(item, message) for item in spec]
    names = [name for name, _, _ in head["arrays"]]
    if len(set(names)) != len(names):
        raise ProtocolError(f"{message}: array names repeat: {names}")
    return head


def _scalar(value: object) -> bool:
    return isinstance(value, (bool, int, float, str))


def _array_spec(item: object, message: str) -> tuple[str, np.dtype, list[int]]:
    ok = isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and item[1] in DTYPES
    shape = item[2] if ok else None
    if not (
        ok
        and isinstance(shape, list)
        and len(shape) <= MAX_DIMS
        and all(type(d) is int and 0 <= d < 1 << 40 for d in shape)
    ):
        raise ProtocolError(
            f"{message}: an array must be [name, one of {sorted(DTYPES)}, up to {MAX_DIMS} sizes], got {item!r:.200}"
        )
    return item[0], np.dtype(item[1]), shape
