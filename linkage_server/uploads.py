"""Parsing and validating one party's identifier upload (a single ``.npy`` array).

Kinds, by dtype: numbers (float/int, 2-D rows x dims) for Euclidean, strings (unicode, 1-D rows
or 2-D rows x columns) for the string metrics (linkage.scorers), bits (uint8, 2-D rows x bytes,
packed Bloom filters) for Hamming. Every
refusal is an :class:`UploadError` whose message names the problem; nothing is stored unless
the whole upload is valid.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from linkage.contracts import MAX_ABS_NUMBER  # numeric identifiers beyond it are refused
from linkage.metrics import DEFAULT_OF_KIND, REGISTRY

KIND_OF_METRIC = {m.name: m.kind for m in REGISTRY.values()}  # linkage.metrics: each metric's identifiers
METRIC_OF_KIND = DEFAULT_OF_KIND  # when none is given


MAX_CHARS = 1000  # string identifiers longer than this are refused: an edit distance costs length squared


class UploadError(ValueError):
    """A malformed or invalid upload."""


@dataclass(frozen=True)
class UploadSummary:
    kind: str
    rows: int
    shape: tuple[int, ...]
    dtype: str
    duplicates: int
    chars: float = 0.0  # strings: the mean characters of a record (all its columns); what a comparison costs

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "rows": self.rows,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "duplicates": self.duplicates,
            **({"chars": round(self.chars, 2)} if self.kind == "strings" else {}),
        }


def to_npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def parse_npy(data: bytes | Path) -> np.ndarray:
    """One .npy array from its bytes, or from a file (memory-mapped: read as it is used)."""
    try:
        arr = (
            np.load(data, mmap_mode="r", allow_pickle=False)
            if isinstance(data, Path)
            else np.load(io.BytesIO(data), allow_pickle=False)
        )
    except Exception as e:  # numpy raises ValueError/OSError/EOFError/... on bad bytes
        raise UploadError(f"malformed upload: not a .npy array ({type(e).__name__}: {e})") from None
    if not isinstance(arr, np.ndarray):
        raise UploadError("malformed upload: expected one .npy array, got an .npz archive")
    return arr


def npy_sha256(data: bytes | Path) -> str:
    """SHA-256 of an upload's bytes, or of a file's (read 1 MiB at a time)."""
    if isinstance(data, Path):
        with open(data, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    return hashlib.sha256(data).hexdigest()


def kind_of(arr: np.ndarray) -> str:
    if arr.dtype == np.uint8:
        return "bits"
    if arr.dtype.kind in "fi" or arr.dtype.kind == "u":
        return "numbers"
    if arr.dtype.kind == "U":
        return "strings"
    raise UploadError(
        f"unsupported identifier dtype {arr.dtype}: send float numbers, unicode strings, or packed bits (uint8)"
    )


BLOCK_VALUES = 1 << 20  # numbers checked at a time: the check's working memory is a block's, not the upload's


def _check_numbers(arr: np.ndarray) -> None:
    """Refuse rows with NaN/inf or beyond +/-MAX_ABS_NUMBER, a block of rows at a time (an upload
    memory-mapped from disk is read once, never copied whole, whatever its dtype)."""
    step = max(1, BLOCK_VALUES // max(arr.shape[1], 1))
    counts, first = {"nan": 0, "huge": 0}, {"nan": [], "huge": []}
    for lo in range(0, len(arr), step):
        block = np.asarray(arr[lo : lo + step])  # (b, d) in its own dtype
        nan = ~np.isfinite(block).all(axis=1)
        wide = np.finfo(block.dtype).max > MAX_ABS_NUMBER  # float32 cannot hold a number beyond the bound
        huge = ~nan & (np.abs(block) > MAX_ABS_NUMBER).any(axis=1) if wide else np.zeros(len(block), bool)
        for name, rows in (("nan", nan), ("huge", huge)):
            counts[name] += int(rows.sum())
            first[name] += (lo + np.flatnonzero(rows)[:5]).tolist()
    if counts["nan"]:
        raise UploadError(f"{counts['nan']} identifier row(s) are NaN/inf (first rows: {first['nan'][:5]})")
    if counts["huge"]:  # finite, but their squared distances overflow to inf and the job could not run
        raise UploadError(
            f"{counts['huge']} identifier row(s) hold a number beyond +/-{MAX_ABS_NUMBER:g} (first "
            f"rows: {first['huge'][:5]}): rescale the identifiers"
        )


def _check_strings(arr: np.ndarray) -> float:
    """Refuse strings over MAX_CHARS and records whose every column is empty (several columns: a
    row may have empty cells); returns a record's mean characters (all its columns), one length
    pass over the values."""
    lengths = np.char.str_len(arr)  # (n,) or (n, c)
    long = lengths > MAX_CHARS
    if long.any():
        rows = np.flatnonzero(long if arr.ndim == 1 else long.any(axis=1))
        raise UploadError(
            f"{len(rows)} identifier(s) are longer than {MAX_CHARS} characters (first rows: "
            f"{rows[:5].tolist()}, up to {int(lengths.max())}): a name, title or address is shorter, "
            "and comparing strings costs their length squared"
        )
    empty = lengths == 0 if arr.ndim == 1 else (lengths == 0).all(axis=1)
    if empty.any():
        raise UploadError(
            f"{int(empty.sum())} identifier(s) are empty strings (first rows: {np.flatnonzero(empty)[:5].tolist()})"
        )
    return float(lengths.mean()) * (arr.shape[1] if arr.ndim == 2 else 1)


def validate(arr: np.ndarray, *, max_rows: int = 50_000_000) -> UploadSummary:
    """Check shape, dtype, NaN/empty identifiers and size; count duplicate identifiers."""
    kind = kind_of(arr)
    want = (1, 2) if kind == "strings" else (2,)
    if arr.ndim not in want:
        shapes = "1-D (rows,) or 2-D (rows, columns)" if kind == "strings" else "2-D"
        raise UploadError(f"{kind} identifiers must be a {shapes} array; got shape {arr.shape}")
    if len(arr) == 0:
        raise UploadError("the upload has zero rows")
    if len(arr) > max_rows:
        raise UploadError(f"the upload has {len(arr)} rows, more than the service's cap of {max_rows}")
    if arr.ndim == 2 and arr.shape[1] == 0:
        raise UploadError("identifiers have zero columns")
    if kind == "numbers" and arr.dtype.kind == "f":  # integers are finite and within +/-1e100 by their type
        _check_numbers(arr)
    chars = _check_strings(arr) if kind == "strings" else 0.0
    keys = (
        arr
        if arr.ndim == 1
        else np.ascontiguousarray(arr).view(np.dtype((np.void, arr.dtype.itemsize * arr.shape[1]))).ravel()
    )
    duplicates = int(len(arr) - len(np.unique(keys)))
    return UploadSummary(kind, int(len(arr)), tuple(int(s) for s in arr.shape), str(arr.dtype), duplicates, chars)
